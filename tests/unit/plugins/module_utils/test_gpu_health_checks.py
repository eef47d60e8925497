# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import struct

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_health_checks as checks

LOGS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu", "kernel-logs"))


def read_log(name):
    with open(os.path.join(LOGS, name)) as handle:
        return handle.read()


# ---------- Xid (real lines, see kernel-logs/SOURCE.md) ----------

def test_real_xid_79_line():
    event = checks.parse_xid_line("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus")
    assert event["code"] == 79 and event["severity"] == "block"
    assert event["pci_bus_id"] == "0000:44:00.0"
    assert event["message"] == "GPU has fallen off the bus"


def test_real_dmesg_and_journal_prefixes():
    events = checks.parse_xid_events(read_log("xid-real.log"))
    codes = [e["code"] for e in events]
    assert codes == [31, 62, 45, 13, 13, 109, 31, 63, 79, 3, 94, 145]
    assert events[0]["log_prefix"] == "[14328.198504]"
    assert events[6]["log_prefix"].startswith("Nov 29 11:28:11 zeus kernel")
    assert events[3]["log_prefix"] == "[Fri Aug 30 11:43:09 2024]"
    assert events[9]["pci_bus_id"] == "0000:01:00.0"  # old "(0000:01:00)" form without "PCI:"
    assert events[8]["pci_bus_id"] == "0000:44:00.0"
    assert events[11]["pci_bus_id"] == "0018:01:00.0"  # non-zero PCI domain


def test_severity_table():
    for code in (48, 79, 95, 119, 64, 62):
        assert checks.xid_severity(code)[0] == "block", code
    for code in (13, 31, 43, 94, 63):
        assert checks.xid_severity(code)[0] == "warn", code
    assert checks.xid_severity(45)[0] == "info"
    assert checks.xid_severity(9999) == ("warn", "Xid 9999 is not in the table; see NVIDIA's Xid catalog")


def test_summary_dedupes_and_splits_block_and_warn():
    events = checks.parse_xid_events(read_log("xid-mixed.log"))
    blocking, warnings = checks.summarize_xids(events)
    assert sorted(int(b.split()[1]) for b in blocking) == [48, 62, 64, 79, 95, 119]
    assert sum(1 for w in warnings if w.startswith("Xid 13 ")) == 1  # two Xid 13 lines, one finding
    assert not any(w.startswith("Xid 45 ") for w in warnings + blocking)  # info only


def test_summary_restricted_to_gpus():
    events = checks.parse_xid_events(read_log("xid-mixed.log"))
    blocking, warnings = checks.summarize_xids(events, ["0000:cb:00.0"])
    assert blocking == [] and all("0000:cb:00.0" in w for w in warnings) and warnings


def test_ignore_and_clean_log():
    assert checks.parse_xid_events(read_log("clean.log")) == []
    events = checks.parse_xid_events(read_log("xid-real.log"), ignore=[31, 13])
    assert 31 not in [e["code"] for e in events] and 13 not in [e["code"] for e in events]


def test_redacted_bus_id_still_counts_with_its_code():
    events = checks.parse_xid_events(read_log("xid-redacted.log"))
    assert [e["code"] for e in events] == [79, 154, 74, 145]
    assert all(e["pci_bus_id"] is None for e in events)
    assert events[0]["severity"] == "block" and events[0]["message"] == "GPU has fallen off the bus."
    assert events[3]["log_prefix"] == "[ 8123.551204]"


@pytest.mark.parametrize("bus", ["PCI:...", "", "PCI:gpu0", "GPU-6a2c9e6e", "PCI:0000:01"])
def test_unfamiliar_bus_forms_count_without_a_bus_id(bus):
    event = checks.parse_xid_line("kernel: NVRM: Xid (%s): 48, pid=1, name=python3, DBE" % bus)
    assert event["code"] == 48 and event["severity"] == "block" and event["pci_bus_id"] is None


def test_event_without_bus_id_counts_for_any_gpu():
    events = checks.parse_xid_events(read_log("xid-redacted.log"))
    blocking = checks.summarize_xids(events, ["0000:cb:00.0"])[0]
    assert any(b.startswith("Xid 79 on GPU (unknown bus id)") for b in blocking)


def test_comment_lines_are_not_events():
    assert checks.parse_xid_line("# CONSTRUCTED lines (not captured anywhere): the driver's line format") is None


# ---------- Xids logged after a time (a GPU fault's return) ----------

# The fault of kernel-logs/xid-journal.log (Xid 48 at 09:00:00 UTC), as the Xid monitor's flag saw it 2 s later.
FAULT_SEEN = checks.parse_time("2026-12-05T09:00:02Z")


@pytest.mark.parametrize("text, seconds", [
    ("2026-12-05T09:00:00Z", 1796461200.0),
    ("2026-12-05T10:00:00+01:00", 1796461200.0),
    ("2026-12-05T10:00:00+0100", 1796461200.0),
    ("2026-12-05 04:00:00.5-05:00", 1796461200.5),
    ("1796461200", 1796461200.0),
    (1796461200, 1796461200.0),
])
def test_times_with_their_zone_or_since_the_epoch(text, seconds):
    assert checks.parse_time(text) == seconds


@pytest.mark.parametrize("text", ["2026-12-05T09:00:00", "Dec  5 09:00:00", "yesterday", "", True])
def test_a_time_whose_zone_is_not_said_is_refused(text):
    with pytest.raises(ValueError, match="ISO 8601 time with its offset"):
        checks.parse_time(text)


def test_journal_lines_carry_their_time_in_each_offset_form():
    events = checks.parse_xid_events(read_log("xid-journal.log"))
    assert [checks.xid_event_time(e) for e in events] == [
        FAULT_SEEN - 2, FAULT_SEEN - 1, FAULT_SEEN - 2 + 1200.123456, FAULT_SEEN - 2 + 2400]


def test_only_xids_after_the_fault_count():
    """A GPU reset without a reboot leaves the fault's Xids in this boot's log: they are the fault's (at or before the
    time the flag saw it), the later ones are new."""
    events = checks.parse_xid_events(read_log("xid-journal.log"))
    counted, left_out = checks.xids_logged_after(events, FAULT_SEEN)
    assert [e["code"] for e in left_out] == [48, 43] and [e["code"] for e in counted] == [154, 79]
    blocking, _warnings = checks.summarize_xids(counted)
    assert [r.split(":")[0] for r in blocking] == ["Xid 154 on GPU 0000", "Xid 79 on GPU 0000"]
    # The operator's confirmation that the GPU was fixed at 09:30 leaves out what the fix logged; 79 came later.
    counted, _left_out = checks.xids_logged_after(events, checks.parse_time("2026-12-05T09:30:00Z"))
    assert [e["code"] for e in counted] == [79]
    # Compared to the second: a line in the same second as the cutoff is left out, the next second counts.
    assert checks.xids_logged_after(events, FAULT_SEEN - 2 + 2400.9)[0] == []
    assert [e["code"] for e in checks.xids_logged_after(events, FAULT_SEEN - 2 + 2399)[0]] == [79]


def test_a_line_without_its_time_always_counts():
    """A syslog stamp has no year nor zone, dmesg --ctime no zone, a bare line nothing: the line might be new."""
    events = checks.parse_xid_events(read_log("xid-real.log"))
    counted, left_out = checks.xids_logged_after(events, FAULT_SEEN + 10 ** 6)
    assert counted == events and left_out == []


def test_dmesg_seconds_since_boot_are_read_against_the_boot_time():
    events = checks.parse_xid_events(read_log("xid-real.log"))[:3]  # [14328.198504] 31, [14370.687545] 62, 45
    boot = FAULT_SEEN - 14370
    assert checks.xid_event_time(events[1], boot) == pytest.approx(boot + 14370.687545)
    counted, left_out = checks.xids_logged_after(events, FAULT_SEEN, boot_time=boot)
    assert [e["code"] for e in left_out] == [31, 62, 45] and counted == []
    counted, _left_out = checks.xids_logged_after(events, FAULT_SEEN - 1, boot_time=boot)
    assert [e["code"] for e in counted] == [62, 45]
    # Without the boot time, seconds since boot say nothing: the lines count.
    assert checks.xids_logged_after(events, FAULT_SEEN)[0] == events


# ---------- IOMMU ----------

@pytest.mark.parametrize("cmdline,units,mode", [
    ("ro quiet", [], "off"),
    ("ro quiet intel_iommu=on iommu=pt", ["dmar0", "dmar1"], "passthrough"),
    ("ro amd_iommu=on", ["ivhd0"], "translated"),
    ("ro intel_iommu=off", None, "off"),
    ("ro", None, "unknown"),
])
def test_iommu_modes(cmdline, units, mode):
    assert checks.evaluate_iommu(cmdline, units)["mode"] == mode


def test_real_h200_cmdline_has_no_iommu_flags():
    path = os.path.join(LOGS, "..", "h200-x1", "live-2026-11-29", "proc-cmdline.txt")
    with open(path) as handle:
        cmdline = handle.read()
    result = checks.evaluate_iommu(cmdline, [])  # /sys/class/iommu was empty there (capture.txt)
    assert result["mode"] == "off" and result["cmdline_flags"] == {}


# ---------- ACS ----------

def config_space(acs_ctl=None):
    """A 4096-byte config space: a vendor-specific ext cap at 0x100 then (optionally) ACS at 0x140."""
    data = bytearray(4096)
    struct.pack_into("<I", data, 0x100, 0x000B | (1 << 16) | ((0x140 if acs_ctl is not None else 0) << 20))
    if acs_ctl is not None:
        struct.pack_into("<I", data, 0x140, 0x000D | (1 << 16))
        struct.pack_into("<H", data, 0x146, acs_ctl)
    return bytes(data)


def test_acs_from_config_space():
    flags = checks.parse_acs_from_config(config_space(0x1D))  # SrcValid ReqRedir CmpltRedir UpstreamFwd
    assert flags["SrcValid"] and flags["ReqRedir"] and flags["CmpltRedir"] and flags["UpstreamFwd"]
    assert not flags["TransBlk"]
    assert checks.acs_redirects(flags)
    assert checks.parse_acs_from_config(config_space(None)) is None
    assert checks.parse_acs_from_config(config_space(0)) == {name: False for name, _b in checks.ACS_BITS}
    assert checks.parse_acs_from_config(b"\x00" * 256) is None  # non-root read: no extended space


LSPCI = """00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal decode])
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
01:00.0 VGA compatible controller: NVIDIA Corporation AD102 [GeForce RTX 4090] (rev a1)
\tSubsystem: Gigabyte Technology Co., Ltd Device 40bf
"""


def test_lspci_acs_parser():
    # the ACSCap/ACSCtl line format of `lspci -vvv` (written here in that format; flags chosen for the test)
    parsed = checks.parse_lspci_acs(LSPCI)
    assert list(parsed) == ["0000:00:01.1"]
    assert parsed["0000:00:01.1"]["ReqRedir"] is True and parsed["0000:00:01.1"]["TransBlk"] is False


def test_evaluate_acs():
    per_gpu = [{"gpu": 0, "pci_bus_id": "0000:01:00.0", "bridges": [{"bdf": "0000:00:01.1", "flags": {"SrcValid": True, "ReqRedir": True}}]},
               {"gpu": 1, "pci_bus_id": "0000:02:00.0", "bridges": [{"bdf": "0000:00:01.2", "flags": None}]}]
    risks, unknown = checks.evaluate_acs(per_gpu)
    assert len(risks) == 1 and "0000:00:01.1" in risks[0] and "SrcValid+" in risks[0]
    assert len(unknown) == 1 and "GPU 1" in unknown[0]


# ---------- ECC / remapping ----------

def test_memory_health():
    ok = {"index": 0, "uuid": "GPU-a", "pci_bus_id": "x", "recovery_action": "None",
          "ecc": {"volatile_uncorrected": 0, "aggregate_uncorrected": 0, "remapped_rows_pending": False}}
    assert checks.evaluate_gpu_memory_health(ok) == ([], [])
    bad = {"index": 1, "uuid": "GPU-b", "pci_bus_id": "y", "recovery_action": "Node Reboot Required",
           "ecc": {"volatile_uncorrected": 3, "remapped_rows_pending": True, "remapped_rows_failure": True,
                   "retired_pages_pending": True, "remapped_rows_uncorrectable": 2, "retired_pages_dbe": 1}}
    blocking, warnings = checks.evaluate_gpu_memory_health(bad)
    assert len(blocking) == 5 and len(warnings) == 2
    assert any("Node Reboot Required" in b for b in blocking)
    lifetime = {"index": 2, "ecc": {"volatile_uncorrected": 0, "aggregate_uncorrected": 4}}
    assert checks.evaluate_gpu_memory_health(lifetime)[0] == []
    assert "lifetime" in checks.evaluate_gpu_memory_health(lifetime)[1][0]
