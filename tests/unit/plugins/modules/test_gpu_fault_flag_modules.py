# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_fault_flag_info and gpu_fault_flag through the ansible CLI, on a flag in a temporary folder: a return's path
(set aside, put back, removed) and its refusals."""
from __future__ import annotations

import json

# The Xid monitor's flag: Xid 48 seen at 2026-12-05T09:00:02Z.
FLAG = {"host": "fleet-ws3", "since": 1796461202,
        "events": [{"code": 48, "pci_bus_id": "0000:01:00.0", "severity": "block", "description": "DBE",
                    "seen": 1796461202}]}


def test_no_flag_is_no_fault(tmp_path, run_module):
    result = run_module("gpu_fault_flag_info", {"path": str(tmp_path / "xid.json")})
    assert result["fault"] is False and result["files"] == [] and result["xids_after"] is None
    assert result["changed"] is False


def test_a_return_that_stopped_leaves_a_fault_and_its_time(tmp_path, run_module):
    (tmp_path / "xid.json.returning").write_text(json.dumps(FLAG))
    result = run_module("gpu_fault_flag_info", {"path": str(tmp_path / "xid.json")})
    assert (result["fault"], result["flagged"], result["returning"]) == (True, False, True)
    assert result["files"] == [str(tmp_path / "xid.json.returning")]
    assert [e["code"] for e in result["events"]] == [48]
    assert result["fault_time"] == result["xids_after"] == "2026-12-05T09:00:02+00:00"


def test_the_operators_later_confirmation_moves_the_xid_check_on(tmp_path, run_module):
    (tmp_path / "xid.json").write_text(json.dumps(FLAG))
    later = run_module("gpu_fault_flag_info", {"path": str(tmp_path / "xid.json"),
                                               "confirmed_after": "2026-12-05T10:30:00+01:00"})
    assert later["fault_time"] == "2026-12-05T09:00:02+00:00" and later["xids_after"] == "2026-12-05T09:30:00+00:00"
    # Before the fault it changes nothing: the fault's own Xids never count.
    earlier = run_module("gpu_fault_flag_info", {"path": str(tmp_path / "xid.json"),
                                                 "confirmed_after": "2026-12-05T08:00:00Z"})
    assert earlier["xids_after"] == "2026-12-05T09:00:02+00:00"


def test_a_confirmation_without_its_zone_is_refused(tmp_path, run_module):
    (tmp_path / "xid.json").write_text(json.dumps(FLAG))
    result = run_module("gpu_fault_flag_info", {"path": str(tmp_path / "xid.json"), "confirmed_after": "2026-12-05 09:30"})
    assert result.get("failed") and result["msg"].startswith("confirmed_after: '2026-12-05 09:30' is not")
    assert "with its offset" in result["msg"]


def test_a_return_sets_the_flag_aside_puts_it_back_and_removes_it(tmp_path, run_module):
    flag = tmp_path / "xid.json"
    flag.write_text(json.dumps(FLAG))
    args = {"path": str(flag), "state": "returning", "xids_checked_after": "2026-12-05T09:00:02Z"}
    checked = run_module("gpu_fault_flag", args, check=True)
    assert checked["changed"] is True and checked["steps"] == ["rename flag returning"] and flag.exists()
    moved = run_module("gpu_fault_flag", args)
    assert (moved["changed"], moved["flagged"], moved["returning"]) == (True, False, True)
    assert json.loads((tmp_path / "xid.json.returning").read_text()) == FLAG
    assert run_module("gpu_fault_flag", args)["changed"] is False  # a re-run finds it set aside
    back = run_module("gpu_fault_flag", {"path": str(flag), "state": "present"})
    assert back["steps"] == ["rename returning flag"] and json.loads(flag.read_text()) == FLAG
    run_module("gpu_fault_flag", args)
    gone = run_module("gpu_fault_flag", {"path": str(flag), "state": "absent"})
    assert (gone["changed"], gone["flagged"], gone["returning"]) == (True, False, False)
    assert list(tmp_path.iterdir()) == []


def test_a_fault_flagged_after_the_preflight_refuses_the_set_aside(tmp_path, run_module):
    flag = tmp_path / "xid.json"
    flag.write_text(json.dumps(FLAG))
    result = run_module("gpu_fault_flag", {"path": str(flag), "state": "returning",
                                           "xids_checked_after": "2026-12-05T09:00:01Z"})
    assert result.get("failed") and "flagged the host again at 2026-12-05T09:00:02+00:00" in result["msg"]
    assert [p.name for p in tmp_path.iterdir()] == ["xid.json"]  # nothing changed


def test_the_set_aside_file_stays_while_the_monitor_flagged_the_host_again(tmp_path, run_module):
    flag = tmp_path / "xid.json"
    (tmp_path / "xid.json.returning").write_text(json.dumps(FLAG))
    flag.write_text(json.dumps(dict(FLAG, events=[dict(FLAG["events"][0], code=79, seen=1796464800)])))
    result = run_module("gpu_fault_flag", {"path": str(flag), "state": "absent"})
    assert result.get("failed") and "flagged the host again during its return (Xid 79 on GPU 0000:01:00.0)" in result["msg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xid.json", "xid.json.returning"]
