# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the real gpu_health_info module through the ansible CLI with replayed nvidia-smi output and kernel logs."""
from __future__ import annotations

import os
import struct

import pytest

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu"))
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")
LOGS = os.path.join(FIXTURES, "kernel-logs")


@pytest.fixture
def health(run_module):
    """health(case, check=False, _env=None, **args): the module, the fake nvidia-smi replaying the case (_env: more
    environment for the ansible CLI)."""
    def run(case, check=False, _env=None, **args):
        env = dict({"FAKE_NVIDIA_SMI_CASE": os.path.join(FIXTURES, case)} if case else {}, **(_env or {})) or None
        return run_module("gpu_health_info", dict({"backend": "nvidia-smi", "nvidia_smi_path": FAKE_SMI}, **args), env,
                          check=check)
    return run


def iommu_host(tmp_path, iommu_units=(), cmdline="ro quiet", acs_ctl=None):
    """A fake /proc + /sys tree: GPU 0000:01:00.0 below bridge 0000:00:01.1 (sysfs layout, relative links)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cmdline").write_text(cmdline + "\n")
    iommu = tmp_path / "sys" / "class" / "iommu"
    iommu.mkdir(parents=True)
    for unit in iommu_units:
        (iommu / unit).mkdir()
    bridge = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:01.1"
    gpu = bridge / "0000:01:00.0"
    gpu.mkdir(parents=True)
    data = bytearray(4096)
    if acs_ctl is not None:
        struct.pack_into("<I", data, 0x100, 0x000D | (1 << 16))
        struct.pack_into("<H", data, 0x106, acs_ctl)
    (bridge / "config").write_bytes(bytes(data))
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.1", devices / "0000:00:01.1")
    os.symlink("../../../devices/pci0000:00/0000:00:01.1/0000:01:00.0", devices / "0000:01:00.0")
    return str(tmp_path)


def test_h200_clean(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "clean.log"))
    assert result["changed"] is False and result["blocking"] is False and result["reasons"] == []
    assert result["gpus"][0]["uuid"] == "GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"
    assert result["kernel_log"]["readable"] is True


def test_h200_with_recorded_xids_blocks(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "xid-real.log"))
    assert result["blocking"] is True
    assert any(r.startswith("Xid 79 on GPU 0000:44:00.0") for r in result["reasons"])
    assert any(w.startswith("Xid 13 ") for w in result["warnings_list"])
    codes = [e["code"] for e in result["xid_events"]]
    assert codes.count(13) == 2 and 79 in codes
    event = [e for e in result["xid_events"] if e["code"] == 79][0]
    assert set(event) == {"code", "pci_bus_id", "message", "severity", "description", "log_prefix"}


def test_ignore_xids(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "xid-real.log"), ignore_xids=[79, 62])
    assert result["blocking"] is False


def test_driver_mismatch_blocks(health):
    result = health("driver-mismatch", kernel_log_path=os.path.join(LOGS, "clean.log"))
    assert result["blocking"] is True and result["driver_library_mismatch"] is True
    assert "Driver/library version mismatch" in result["reasons"][0]


def test_no_driver_is_not_blocking(health):
    result = health("no-driver", kernel_log_path=os.path.join(LOGS, "clean.log"))
    assert result["blocking"] is False and result["msg"].startswith("no NVIDIA GPU")


def test_unreadable_kernel_log_is_a_clear_failure(tmp_path, health):
    result = health("h200-x1", kernel_log_path=str(tmp_path / "missing.log"))
    assert result["failed"] is True
    assert result["msg"].startswith("kernel_log_path %s is not readable" % (tmp_path / "missing.log"))
    assert "Traceback" not in str(result.get("exception", ""))  # ansible-core 2.21 adds a placeholder key


def test_only_xids_after_the_given_time_count(health):
    """A return after a GPU reset: the fault's Xids (48 at 09:00:00 UTC, 43 at 09:00:01) are still in this boot's
    journal and are left out; those logged later (154 at 09:20, 79 at 09:40 on another GPU) still block."""
    log = os.path.join(LOGS, "xid-journal.log")
    after_fault = health("h200-x1", kernel_log_path=log, xids_after="2026-12-05T09:00:02+00:00")
    assert after_fault["blocking"] is True
    assert [r.split(" on ")[0] for r in after_fault["reasons"]] == ["Xid 154", "Xid 79"]
    assert after_fault["kernel_log"]["xids_after"] == "2026-12-05T09:00:02+00:00"
    assert after_fault["kernel_log"]["xids_left_out"] == 2
    assert [e["code"] for e in after_fault["xid_events"]] == [48, 43, 154, 79]  # every event found is reported
    assert health("h200-x1", kernel_log_path=log, xids_after="2026-12-05T09:45:00Z")["blocking"] is False
    assert [r.split(" on ")[0] for r in health("h200-x1", kernel_log_path=log)["reasons"]] == ["Xid 48", "Xid 154", "Xid 79"]


def test_a_line_whose_time_is_not_in_it_counts_whatever_the_time(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "xid-constructed.log"), xids_after="2099-01-01T00:00:00Z")
    assert result["blocking"] is True and result["kernel_log"]["xids_left_out"] == 0


def test_dmesg_lines_are_timed_from_the_boot(tmp_path, health):
    """Without a journal, dmesg's seconds since boot are read against /proc/stat's btime."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    dmesg = bindir / "dmesg"
    dmesg.write_text("#!/bin/sh\ncat %s\n" % os.path.join(LOGS, "xid-real.log"))
    dmesg.chmod(0o755)
    (tmp_path / "root").mkdir()
    root = iommu_host(tmp_path / "root")
    with open(os.path.join(root, "proc", "stat"), "w") as handle:
        handle.write("cpu  1 2 3 4\nbtime 1796446830\n")  # 14370 s before 09:00:00Z, when Xid 62 was logged
    path = "%s:%s" % (bindir, os.environ["PATH"])
    result = health("h200-x1", kernel_log_source="dmesg", host_root=root, check_acs=False,
                    xids_after="2026-12-05T09:00:00Z", _env={"PATH": path})
    assert result["kernel_log"]["source"] == "dmesg", result.get("msg")
    # 31, 62 and 45 carry seconds since boot, at or before 09:00:00; every other line of the log has no such stamp.
    assert result["kernel_log"]["xids_left_out"] == 3
    assert not [r for r in result["reasons"] if r.startswith("Xid 62 ")]
    assert [r for r in result["reasons"] if r.startswith("Xid 79 ")]


def test_a_time_without_its_zone_is_a_clear_failure(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "clean.log"), xids_after="2026-12-05 09:00")
    assert result["failed"] is True and result["msg"].startswith("xids_after: '2026-12-05 09:00' is not")


def test_missing_gpu_uuid_is_a_clear_failure(health):
    result = health("h200-x1", kernel_log_path=os.path.join(LOGS, "clean.log"), gpu_uuids=["GPU-gone"])
    assert result["failed"] is True and "GPU-gone" in result["msg"] and "not present" in result["msg"]


def test_iommu_and_acs_on_a_fake_host(tmp_path, health):
    # two GPUs (the 5090 case) so that the P2P risks apply; the fake sysfs holds GPU 0000:01:00.0 under a bridge
    # with ACS SrcValid+ReqRedir+CmpltRedir set, and a translating IOMMU
    root = iommu_host(tmp_path, iommu_units=["dmar0"], cmdline="ro intel_iommu=on", acs_ctl=0x0D)
    result = health("dual-5090-gns", kernel_log_path=os.path.join(LOGS, "clean.log"), host_root=root)
    assert result["iommu"]["mode"] == "translated"
    assert result["acs"][0]["bridges"][0]["bdf"] == "0000:00:01.1"
    assert result["acs"][0]["bridges"][0]["flags"]["ReqRedir"] is True
    assert len(result["p2p_risks"]) == 2
    assert result["blocking"] is False  # risks turn P2P off (gpu_topology_info), they do not stop the rollout


def test_passthrough_iommu_and_acs_off(tmp_path, health):
    root = iommu_host(tmp_path, iommu_units=["dmar0"], cmdline="ro intel_iommu=on iommu=pt", acs_ctl=0)
    result = health("dual-5090-gns", kernel_log_path=os.path.join(LOGS, "clean.log"), host_root=root)
    assert result["iommu"]["mode"] == "passthrough" and result["p2p_risks"] == []


def test_check_apply_and_again_report_the_same_read_only_facts(health):
    log = os.path.join(LOGS, "xid-real.log")
    check, apply, again = (health("h200-x1", check=mode, kernel_log_path=log) for mode in (True, False, False))
    for result in (check, apply, again):
        assert result["changed"] is False and not result.get("failed"), result.get("msg")
        assert result["blocking"] is True  # the recorded Xid 79
    for key in ("gpus", "reasons", "xid_events", "kernel_log"):
        assert check[key] == apply[key] == again[key], key
