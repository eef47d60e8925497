# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base of the collection's read-only action plugins (gpu_preflight, kv_preflight, vllm_server_check): one task
that reads the host through modules and decides on the controller, changing nothing."""
from __future__ import annotations

from ansible.plugins.action import ActionBase


class ReadOnlyAction(ActionBase):
    """Validates the task's arguments against ARGUMENT_SPEC, then returns decide(result, params, task_vars); removes
    what the modules it ran left in the host's temporary folder."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    ARGUMENT_SPEC: dict = {}
    MUTUALLY_EXCLUSIVE: list = []

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        validation, params = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC,
                                                         mutually_exclusive=self.MUTUALLY_EXCLUSIVE)
        del validation
        result["changed"] = False
        try:
            return self.decide(result, params, task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def decide(self, result, params, task_vars):
        raise NotImplementedError
