# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only: SIGKILL ansible-playbook (as a dying controller) at the start of a chosen task, i.e. right after the task
before it finished on every host, and optionally power-cut a lab host first (`docker kill` of its container).

Enabled by the crash checks only (ANSIBLE_CALLBACK_PLUGINS=tests/crash/callback_plugins, ANSIBLE_CALLBACKS_ENABLED=
crash_at). Environment:
  ONPREM_CRASH_PLAY       count tasks from the start of the play with this name (default: the fleet rollout's first
                          serving play, the deployments' canaries)
  ONPREM_CRASH_AT_INDEX   kill at the start of the play's Nth task (1-based, included tasks counted as they start)
  ONPREM_CRASH_AT_TASK    kill at the start of the first task of that play whose name holds this text
  ONPREM_CRASH_POWER_CUT  a lab host's container: `docker kill` it just before the kill (a power cut)
  ONPREM_CRASH_LOG        JSON lines: each task of the play as it starts ({index, name, action}), each host's result
                          ({index, host, status}) and the kill ({killed: index})
The linear strategy starts a task only after the previous one returned on every host: nothing of the task at which
the kill lands has run.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: crash_at
type: aggregate
short_description: Test-only - kill the play at a chosen task (and power-cut a lab host)
description:
  - Used by the crash checks of the fleet scenario and tests/crash/crash_points.py. Configured by environment variables.
requirements: [docker CLI for a power cut]
"""

import json
import os
import signal
import subprocess

from ansible.plugins.callback import CallbackBase

# The rollout's first play that touches a server (playbooks/rollout.yml): each deployment on its canary.
CANARY_PLAY = "Roll each deployment on its canary first, one host at a time"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "crash_at"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.play_name = os.environ.get("ONPREM_CRASH_PLAY", CANARY_PLAY)
        self.at_index = int(os.environ.get("ONPREM_CRASH_AT_INDEX", "0") or 0)
        self.at_task = os.environ.get("ONPREM_CRASH_AT_TASK", "")
        self.power_cut = os.environ.get("ONPREM_CRASH_POWER_CUT", "")
        self.log_path = os.environ.get("ONPREM_CRASH_LOG", "")
        self.counting = False
        self.index = 0

    def _log(self, record):
        if self.log_path:
            with open(self.log_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())

    def v2_playbook_on_play_start(self, play):
        # Counting goes on through the plays after the canary play (the batches, the summary): a kill there is
        # "after the last task".
        if play.get_name() == self.play_name:
            self.counting = True

    def _task_start(self, task):
        if not self.counting:
            return
        self.index += 1
        name = task.get_name()
        self._log({"index": self.index, "name": name, "action": task.action})
        if self.index == self.at_index or (self.at_task and self.at_task in name):
            if self.power_cut:
                subprocess.run(["docker", "kill", self.power_cut], capture_output=True, check=False)
            self._log({"killed": self.index, "power_cut": self.power_cut})
            os.kill(os.getpid(), signal.SIGKILL)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_start(task)

    def _result(self, result, status):
        if self.counting:
            self._log({"index": self.index, "host": result._host.get_name(), "status": status})

    def v2_runner_on_ok(self, result):
        self._result(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._result(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._result(result, "unreachable")
