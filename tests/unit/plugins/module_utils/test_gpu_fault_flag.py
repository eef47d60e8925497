# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU fault flag's return, state by state: every pair of files a run (or a kill between two of its steps) can
leave, taken to each state; then the steps carried out on real files."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_fault_flag as fault

NOW = 1796464800  # 2026-12-05T10:00:00Z
# The Xid monitor's flag (roles/monitoring/files/xid_monitor.py drain()): Xid 48 seen at 09:00:02, 79 at 09:00:04.
FLAG = {"host": "fleet-ws3", "since": NOW - 3598,
        "events": [{"code": 48, "pci_bus_id": "0000:01:00.0", "severity": "block", "description": "DBE", "seen": NOW - 3598},
                   {"code": 79, "pci_bus_id": "0000:01:00.0", "severity": "block", "description": "off the bus",
                    "seen": NOW - 3596}]}
# What the monitor writes on a critical Xid while the flag is set aside: a new flag with the new event alone.
NEW_FLAG = {"host": "fleet-ws3", "since": NOW - 60,
            "events": [{"code": 79, "pci_bus_id": "0000:02:00.0", "severity": "block", "description": "off the bus",
                        "seen": NOW - 60}]}


def file(content, mtime=NOW - 3000):
    return {"content": content, "mtime": mtime}


def test_the_set_aside_file_is_next_to_the_flag():
    assert fault.returning_path("/var/lib/onprem-vllm-gpu-fault/xid.json") == \
        "/var/lib/onprem-vllm-gpu-fault/xid.json.returning"


def test_the_fault_time_is_the_last_event_seen_else_since_else_the_files_time():
    assert fault.fault_time(FLAG, NOW) == NOW - 3596
    assert fault.fault_time({"since": NOW - 100, "events": []}, NOW) == NOW - 100
    assert fault.fault_time(None, NOW - 5) == NOW - 5  # not JSON: a flag all the same
    assert fault.fault_time(fault.parse_content('["a list"]'), NOW - 5) == NOW - 5
    assert fault.parse_content("{truncated") is None


@pytest.mark.parametrize("flag, returning, expected", [
    (None, None, {"fault": False, "flagged": False, "returning": False, "fault_time": None, "codes": []}),
    (file(FLAG), None, {"fault": True, "flagged": True, "returning": False, "fault_time": NOW - 3596, "codes": [48, 79]}),
    # A return that stopped before the host was back in rotation: the set-aside file is the flag.
    (None, file(FLAG), {"fault": True, "flagged": False, "returning": True, "fault_time": NOW - 3596, "codes": [48, 79]}),
    # The monitor flagged the host again since: both count, the later fault's time.
    (file(NEW_FLAG), file(FLAG), {"fault": True, "flagged": True, "returning": True, "fault_time": NOW - 60,
                                  "codes": [48, 79, 79]}),
])
def test_what_the_files_say(flag, returning, expected):
    state = fault.view(flag, returning)
    assert dict((k, state[k]) for k in ("fault", "flagged", "returning", "fault_time")) == \
        dict((k, v) for k, v in expected.items() if k != "codes")
    assert [e["code"] for e in state["events"]] == expected["codes"]


def test_merging_keeps_every_event_once_oldest_first():
    merged = fault.merge(NEW_FLAG, FLAG, fault.merge(FLAG, NEW_FLAG))
    assert [(e["code"], e["seen"]) for e in merged["events"]] == [(48, NOW - 3598), (79, NOW - 3596), (79, NOW - 60)]
    assert merged["since"] == NOW - 3598 and merged["host"] == "fleet-ws3"
    assert fault.merge(None, None) == {"events": []}


# returning: the flag set aside once the preflight checked the Xids after the fault (NOW - 3596).
@pytest.mark.parametrize("flag, returning, steps", [
    (file(FLAG), None, [("rename", "flag", "returning")]),
    (None, file(FLAG), []),  # set aside already (a return killed after it): nothing to do
])
def test_returning(flag, returning, steps):
    assert fault.transition("returning", flag, returning, NOW, "ws", checked_after=NOW - 3596) == (steps, None)


def test_returning_merges_a_flag_the_monitor_wrote_into_a_set_aside_file():
    steps, error = fault.transition("returning", file(NEW_FLAG), file(FLAG), NOW, "ws", checked_after=NOW - 60)
    assert error is None and [s[:2] for s in steps] == [("write", "returning"), ("remove", "flag")]
    assert [e["code"] for e in steps[0][2]["events"]] == [48, 79, 79]


def test_returning_refuses_a_fault_flagged_after_the_preflight_checked_the_xids():
    steps, error = fault.transition("returning", file(NEW_FLAG), file(FLAG), NOW, "ws", checked_after=NOW - 3596)
    assert steps == [] and "flagged the host again at 2026-12-05T09:59:00+00:00, after this run's GPU preflight" in error
    assert "logged after 2026-12-05T09:00:04+00:00" in error


def test_returning_without_a_flag_is_refused():
    assert fault.transition("returning", None, None, NOW, "ws")[1].startswith("no GPU fault flag")


@pytest.mark.parametrize("flag, returning, steps", [
    (None, file(FLAG), [("rename", "returning", "flag")]),
    (file(FLAG), None, []),
    # Both gone (removed by hand mid-run): a flag without events keeps the host out all the same.
    (None, None, [("write", "flag", {"host": "ws", "since": NOW, "events": []})]),
])
def test_present(flag, returning, steps):
    assert fault.transition("present", flag, returning, NOW, "ws") == (steps, None)


def test_present_merges_the_set_aside_file_into_a_flag_the_monitor_wrote():
    steps, error = fault.transition("present", file(NEW_FLAG), file(FLAG), NOW, "ws")
    assert error is None and [s[:2] for s in steps] == [("write", "flag"), ("remove", "returning")]
    assert [e["code"] for e in steps[0][2]["events"]] == [48, 79, 79]


@pytest.mark.parametrize("returning, steps", [(file(FLAG), [("remove", "returning")]), (None, [])])
def test_absent_once_the_host_is_back(returning, steps):
    assert fault.transition("absent", None, returning, NOW, "ws") == (steps, None)


def test_absent_is_refused_while_the_monitor_flagged_the_host_again():
    steps, error = fault.transition("absent", file(NEW_FLAG), file(FLAG), NOW, "ws")
    assert steps == [] and "flagged the host again during its return (Xid 79 on GPU 0000:02:00.0)" in error


def test_the_steps_on_real_files_and_a_kill_between_two_of_them(tmp_path):
    flag = str(tmp_path / "xid.json")
    (tmp_path / "xid.json").write_text(json.dumps(NEW_FLAG))
    (tmp_path / "xid.json.returning").write_text(json.dumps(FLAG))
    steps, _error = fault.transition("returning", *fault.read(flag), now=NOW, host="ws", checked_after=NOW)
    # Killed after the merged set-aside file was written, before the flag was removed: the next run merges again,
    # every event still once.
    fault.apply(steps[:1], flag)
    steps, _error = fault.transition("returning", *fault.read(flag), now=NOW, host="ws", checked_after=NOW)
    fault.apply(steps, flag)
    flagged, returning = fault.read(flag)
    assert flagged is None and [e["code"] for e in returning["content"]["events"]] == [48, 79, 79]
    assert oct(os.stat(fault.returning_path(flag)).st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(tmp_path)) == ["xid.json.returning"]  # no temporary file left
    fault.apply(fault.transition("present", *fault.read(flag), now=NOW, host="ws")[0], flag)
    assert sorted(os.listdir(tmp_path)) == ["xid.json"]
    fault.apply(fault.transition("returning", *fault.read(flag), now=NOW, host="ws")[0], flag)
    fault.apply(fault.transition("absent", *fault.read(flag), now=NOW, host="ws")[0], flag)
    assert os.listdir(tmp_path) == []


def test_a_file_that_cannot_be_read_is_not_an_absent_flag(tmp_path):
    (tmp_path / "xid.json").mkdir()  # reading it fails (IsADirectoryError), as a permission error would
    with pytest.raises(OSError):
        fault.read(str(tmp_path / "xid.json"))
