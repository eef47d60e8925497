# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's first play on a host whose GPU fault flag a return set aside and never removed (a gpu_return.yml run
that stopped before the host was back in rotation): a plain rollout refuses it as it refuses the flag, gpu_return.yml
takes it on. Each run is made to stop at the check right after the flag's (a batch of 0 hosts), before anything
could change."""
from __future__ import annotations

import json
import os

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = "[vllm_servers]\nlocalhost ansible_connection=local\n"
REFUSAL = "Refuse a host a critical Xid took out of rotation, unless this run returns it (and one that it cannot)"
NEXT_CHECK = "Check the gateway, the batches and the failure budget"
# The Xid monitor's flag: Xid 79 seen at 2026-12-05T09:00:02Z.
FLAG = {"host": "localhost", "since": 1796461202,
        "events": [{"code": 79, "pci_bus_id": "0000:01:00.0", "severity": "block", "description": "off the bus",
                    "seen": 1796461202}]}


@pytest.fixture
def rollout(run_playbook, tmp_path):
    """rollout(playbook, **variables) -> the run, with the host's flag at tmp_path/fault/xid.json."""
    (tmp_path / "fault").mkdir()

    def run(playbook, **variables):
        return run_playbook("- ansible.builtin.import_playbook: %s/playbooks/%s\n" % (ROOT, playbook),
                            dict({"monitoring_xid_drain_flag": str(tmp_path / "fault" / "xid.json"),
                                  "ansible_become": False, "onprem_vllm_rollout_serial": [0]}, **variables),
                            inventory=INVENTORY)
    return run


def result(run, name):
    return [r for task, r in run.tasks if task == name][0]


def test_a_rollout_refuses_a_host_whose_return_stopped(rollout, tmp_path):
    (tmp_path / "fault" / "xid.json.returning").write_text(json.dumps(FLAG))
    run = rollout("rollout.yml")
    assert run.rc != 0 and run.failed
    message = run.failure()
    assert message.startswith("localhost is out of rotation since a critical Xid (%s: Xid 79; a return of it stopped "
                              "before the host was back in rotation). Nothing was drained or changed."
                              % (tmp_path / "fault" / "xid.json.returning"))
    assert "playbooks/gpu_return.yml -i <inventory> -l localhost" in message
    assert [task for task, _r in run.tasks][-1] == REFUSAL


def test_gpu_return_takes_on_a_return_that_stopped(rollout, tmp_path):
    (tmp_path / "fault" / "xid.json.returning").write_text(json.dumps(FLAG))
    run = rollout("gpu_return.yml")
    read = result(run, "Read the host's GPU fault flag (the Xid monitor's, or the one a return set aside and has not "
                       "finished)")
    assert (read["fault"], read["flagged"], read["returning"]) == (True, False, True)
    # The time after which the return's GPU preflight counts Xids (playbooks/tasks/preflight_deployment.yml).
    assert read["xids_after"] == "2026-12-05T09:00:02+00:00"
    assert not result(run, REFUSAL).get("failed")
    assert "onprem_vllm_rollout_serial must hold host counts >= 1" in run.failure()  # the next check: it went on
    assert [task for task, _r in run.tasks][-1] == NEXT_CHECK


def test_gpu_return_refuses_a_host_without_a_fault(rollout):
    run = rollout("gpu_return.yml")
    assert run.failure().startswith("localhost is not out of rotation after a GPU fault")
    assert "gpu_return.yml has nothing to return there" in run.failure()


def test_gpu_return_refuses_to_return_some_deployments_only(rollout, tmp_path):
    (tmp_path / "fault" / "xid.json").write_text(json.dumps(FLAG))
    run = rollout("gpu_return.yml", onprem_vllm_rollout_deployments=["default"],
                  onprem_vllm_deployments=[{"name": "default"}, {"name": "other", "port": 8001}])
    assert "gpu_return.yml returns every deployment of localhost" in (run.failure() or ""), run.failure()
