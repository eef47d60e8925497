# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure health checks for NVIDIA GPU hosts: Xid events, IOMMU, PCIe ACS, ECC / retired pages / remapped rows.

Standard library only. ``parse_xid_line``, ``parse_xid_events`` and ``XID_TABLE`` are kept self-contained so a
later Xid monitor can import them without the rest of this file.

Xid severity table
------------------
``block``: the GPU needs a reset, a reboot or service before it can be trusted with a rollout.
``warn``:  usually an application fault or a recoverable event; worth a look, not a reason to stop.
``info``:  informational.

Sources for the descriptions and the classification:
  * NVIDIA, "Xid Errors" and "Analyzing Xid Errors with the Xid Catalog" (resolution buckets RESTART_APP /
    RESET_GPU / RESTART_BM / CONTACT_SUPPORT), https://docs.nvidia.com/deploy/xid-errors/index.html and
    https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
  * NVIDIA, "GPU Debug Guidelines", https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html
  * NVIDIA Health Validation, "Xid Checks" (Xid 46/48 critical, drain + reset),
    https://docs.nvidia.com/health-validation/reference/checks/xid.md
The classification (which bucket blocks a rollout) is this collection's decision: anything NVIDIA resolves with
a GPU reset, a node reboot or support blocks; anything resolved by restarting the application warns.
Codes not in the table are reported with severity ``warn`` and the note "not in the table".
"""

from __future__ import annotations

import datetime
import re
import struct

# code: (severity, short description)
XID_TABLE = {
    8: ("warn", "GPU stopped processing (channel idle timeout); usually the application"),
    13: ("warn", "Graphics Engine Exception; usually an application fault (out-of-range access, illegal instruction)"),
    31: ("warn", "GPU memory page fault; usually an application illegal address access"),
    32: ("warn", "Invalid or corrupted push buffer stream"),
    38: ("block", "Driver firmware error"),
    43: ("warn", "GPU stopped processing; the channel was reset after an application fault"),
    45: ("info", "Preemptive cleanup after previous errors (follows another Xid)"),
    46: ("block", "GPU stopped processing; drain and reset the GPU"),
    48: ("block", "Double Bit ECC Error (DBE): uncorrectable memory error; reset the GPU"),
    61: ("warn", "Internal micro-controller breakpoint/warning"),
    62: ("block", "Internal micro-controller halt; reset the GPU"),
    63: ("warn", "ECC page retirement or row remapping recorded; reset the GPU to activate it"),
    64: ("block", "ECC page retirement or row remapping recording failure"),
    68: ("warn", "Video processor (NVDEC) exception"),
    69: ("warn", "Graphics Engine class error"),
    74: ("block", "NVLink error; check the NVLink connection and reset the GPU"),
    79: ("block", "GPU has fallen off the bus; the GPU is unusable until the host is rebooted"),
    92: ("warn", "High single-bit ECC error rate"),
    94: ("warn", "Contained ECC error; the affected application must restart"),
    95: ("block", "Uncontained ECC error; reset the GPU"),
    109: ("warn", "Context switch timeout"),
    119: ("block", "GSP RPC timeout; reset the GPU (or reboot)"),
    120: ("block", "GSP error; reset the GPU (or reboot)"),
    121: ("warn", "C2C link corrected error"),
    140: ("block", "Unrecovered ECC error"),
    143: ("block", "GPU initialization failure"),
    154: ("block", "GPU recovery action changed (reset or reboot required)"),
}

# "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# older drivers: "NVRM: Xid (0000:01:00): 13, Graphics Exception: ..."
# Public reports often redact the bus id ("NVRM: Xid (PCI:...): 79, ..."): whatever is in the parentheses, the line
# still counts with its code; the bus id is then None (unknown GPU).
_XID_RE = re.compile(r"NVRM: Xid \((?P<bus>[^)]*)\):\s*(?P<code>\d+)\s*,\s*(?P<msg>.*)$")
_XID_BUS_RE = re.compile(r"^(?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)$")


def xid_severity(code, table=None):
    """(severity, description) for an Xid code."""
    entry = (table or XID_TABLE).get(int(code))
    if entry is None:
        return "warn", "Xid %s is not in the table; see NVIDIA's Xid catalog" % code
    return entry


def _pci_from_xid(bus):
    """dddd:bb:dd.f from the driver's bus id, or None when it is redacted or in a form not known here."""
    match = _XID_BUS_RE.match(bus.strip())
    if not match:
        return None
    parts = match.group("bus").split(":")
    domain = int(parts[0], 16)
    rest = ":".join(parts[1:])
    if "." not in rest:
        rest += ".0"
    return "%04x:%s" % (domain, rest.lower())


def parse_xid_line(line, table=None):
    """Parse one kernel log line. Returns an event dict or None when the line is not an Xid report."""
    match = _XID_RE.search(line or "")
    if not match:
        return None
    code = int(match.group("code"))
    severity, description = xid_severity(code, table)
    prefix = line[:match.start()].strip()
    return {
        "code": code,
        "pci_bus_id": _pci_from_xid(match.group("bus")),
        "message": match.group("msg").strip(),
        "severity": severity,
        "description": description,
        "log_prefix": prefix.rstrip(":").strip() or None,
    }


def parse_xid_events(text, table=None, ignore=None):
    """All Xid events in a kernel log text (journal or dmesg format), oldest first."""
    ignore = set(int(c) for c in (ignore or []))
    events = []
    for line in (text or "").splitlines():
        event = parse_xid_line(line, table)
        if event is not None and event["code"] not in ignore:
            events.append(event)
    return events


def summarize_xids(events, gpu_bus_ids=None):
    """Blocking reasons and warnings from Xid events. gpu_bus_ids (normalized) restricts them to these GPUs."""
    wanted = set(gpu_bus_ids) if gpu_bus_ids else None
    blocking, warnings = [], []
    seen = set()
    for event in events:
        # An event without a bus id (redacted, unfamiliar form) may be on any GPU: it always counts.
        if wanted is not None and event["pci_bus_id"] is not None and event["pci_bus_id"] not in wanted:
            continue
        key = (event["code"], event["pci_bus_id"])
        if key in seen:
            continue
        seen.add(key)
        text = "Xid %d on GPU %s: %s (log: %s)" % (event["code"], event["pci_bus_id"] or "(unknown bus id)",
                                                   event["description"], event["message"][:160])
        if event["severity"] == "block":
            blocking.append(text)
        elif event["severity"] == "warn":
            warnings.append(text)
    return blocking, warnings


# "2026-12-05T09:00:00+0000" (journalctl -o short-iso), "...T09:00:00.123456+00:00" (short-iso-precise, rsyslog's
# RFC 3339 files), "...Z". A time without its offset is not read: whose zone it is, the log does not say.
_ISO_TIME_RE = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})(?P<fraction>[.,]\d+)?"
                          r"(?P<offset>Z|[+-]\d{2}:?\d{2})")
# dmesg's own stamp: seconds since boot, "[  269.517039]".
_UPTIME_RE = re.compile(r"^\[\s*(?P<seconds>\d+\.\d+)\]")


def parse_time(value):
    """Seconds since the epoch from a number, a number as text, or an ISO 8601 time with its offset
    (2026-12-05T09:00:00+01:00, ...Z). Raises ValueError for anything else, a time without offset included."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _ISO_TIME_RE.match(text)
    if not match or match.end() != len(text):
        raise ValueError("%r is not seconds since the epoch nor an ISO 8601 time with its offset "
                         "(e.g. 2026-12-05T09:00:00+01:00 or 2026-12-05T08:00:00Z)" % (value,))
    offset = match.group("offset")
    if offset == "Z":
        zone = datetime.timezone.utc
    else:
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        zone = datetime.timezone(sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    stamp = datetime.datetime.strptime(match.group("date") + "T" + match.group("time"), "%Y-%m-%dT%H:%M:%S")
    fraction = float("0." + match.group("fraction")[1:]) if match.group("fraction") else 0.0
    return stamp.replace(tzinfo=zone).timestamp() + fraction


def xid_event_time(event, boot_time=None):
    """When the event's line was logged (seconds since the epoch), from its log_prefix: an ISO 8601 stamp with its
    offset (the journal's short-iso), or dmesg's seconds since boot when boot_time (the boot's epoch seconds) is given.
    None when the line does not say (a syslog or dmesg --ctime stamp has no year or zone, a bare line no stamp)."""
    prefix = event.get("log_prefix") or ""
    match = _ISO_TIME_RE.match(prefix)
    if match:
        return parse_time(match.group(0))
    match = _UPTIME_RE.match(prefix)
    if match and boot_time is not None:
        return boot_time + float(match.group("seconds"))
    return None


def xids_logged_after(events, after, boot_time=None):
    """(events that count, events left out): an event logged at or before `after` (seconds since the epoch, compared
    to the second: the journal's stamps and the fault flag's times are whole seconds) is left out; one logged later,
    or whose time its line does not say, counts."""
    counted, left_out = [], []
    for event in events:
        logged = xid_event_time(event, boot_time)
        if logged is not None and int(logged) <= int(after):
            left_out.append(event)
        else:
            counted.append(event)
    return counted, left_out


# ---------------------------------------------------------------------------------------------------------------
# IOMMU

def parse_iommu_cmdline(cmdline):
    """Kernel command-line IOMMU settings -> dict(flags, passthrough, disabled, forced_on)."""
    flags = {}
    for token in (cmdline or "").split():
        key, _sep, value = token.partition("=")
        if key in ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough", "iommu.strict"):
            flags[key] = value
    values = {k: set(v.lower().split(",")) for k, v in flags.items()}
    passthrough = ("pt" in values.get("iommu", set()) or "1" in values.get("iommu.passthrough", set())
                   or "pt" in values.get("amd_iommu", set()) or "pt" in values.get("intel_iommu", set()))
    disabled = ("off" in values.get("intel_iommu", set()) or "off" in values.get("amd_iommu", set())
                or "off" in values.get("iommu", set()))
    forced_on = "on" in values.get("intel_iommu", set()) or "on" in values.get("amd_iommu", set()) or "force" in values.get("iommu", set())
    return {"flags": flags, "passthrough": passthrough, "disabled": disabled, "forced_on": forced_on}


def evaluate_iommu(cmdline, sysfs_units):
    """IOMMU mode: 'off' | 'passthrough' | 'translated' | 'unknown', with a reason line.

    sysfs_units: entries of /sys/class/iommu (None when the folder could not be read)."""
    parsed = parse_iommu_cmdline(cmdline)
    units = list(sysfs_units or [])
    if sysfs_units is not None and not units:
        mode = "off"
        reason = "no IOMMU unit under /sys/class/iommu"
    elif parsed["passthrough"]:
        mode = "passthrough"
        reason = "IOMMU in passthrough mode (%s): device DMA is not translated" % " ".join(
            "%s=%s" % kv for kv in sorted(parsed["flags"].items()))
    elif parsed["disabled"] and not units:
        mode = "off"
        reason = "IOMMU disabled on the kernel command line"
    elif units:
        mode = "translated"
        reason = ("IOMMU active in translated mode (%d unit(s): %s; cmdline: %s): GPU peer-to-peer DMA can be routed "
                  "through the root complex, which NCCL documents as slow or hanging; set iommu=pt or disable it"
                  % (len(units), ", ".join(sorted(units)[:4]),
                     " ".join("%s=%s" % kv for kv in sorted(parsed["flags"].items())) or "no IOMMU flags"))
    else:
        mode = "unknown"
        reason = "IOMMU state unknown (/sys/class/iommu unreadable)"
    return {"mode": mode, "reason": reason, "cmdline_flags": parsed["flags"], "units": sorted(units)}


# ---------------------------------------------------------------------------------------------------------------
# PCIe ACS

ACS_BITS = (
    ("SrcValid", 0x01),
    ("TransBlk", 0x02),
    ("ReqRedir", 0x04),
    ("CmpltRedir", 0x08),
    ("UpstreamFwd", 0x10),
    ("EgressCtrl", 0x20),
    ("DirectTrans", 0x40),
)
_ACS_EXT_CAP_ID = 0x000D


def acs_flags_from_ctl(value):
    return {name: bool(value & bit) for name, bit in ACS_BITS}


def acs_redirects(flags):
    """True when ACS sends peer-to-peer requests or completions up to the root complex."""
    return bool(flags.get("ReqRedir") or flags.get("CmpltRedir"))


def parse_acs_from_config(config):
    """ACS control flags from a PCI config-space dump (bytes of /sys/bus/pci/devices/X/config).

    Returns None when the extended config space is not present (fewer than 4096 bytes: the file reads
    short when not root) or the device has no ACS capability; otherwise a flags dict."""
    if config is None or len(config) < 0x104:
        return None
    offset = 0x100
    visited = set()
    while offset and offset not in visited and offset + 8 <= len(config):
        visited.add(offset)
        header = struct.unpack_from("<I", config, offset)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        cap_id = header & 0xFFFF
        next_offset = (header >> 20) & 0xFFC
        if cap_id == _ACS_EXT_CAP_ID:
            ctl = struct.unpack_from("<H", config, offset + 6)[0]
            return acs_flags_from_ctl(ctl)
        offset = next_offset
    return None


_LSPCI_DEV_RE = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<desc>.*)$")
_ACSCTL_RE = re.compile(r"ACSCtl:\s*(?P<flags>.*)$")


def parse_lspci_acs(text):
    """ACS control of every device in ``lspci -vvv`` output: {bdf: flags dict}. Devices without ACSCtl are left out."""
    result = {}
    current = None
    for line in (text or "").splitlines():
        match = _LSPCI_DEV_RE.match(line)
        if match and not line.startswith((" ", "\t")):
            bdf = match.group("bdf").lower()
            current = bdf if bdf.count(":") == 2 else "0000:" + bdf
            continue
        acs = _ACSCTL_RE.search(line)
        if acs and current:
            flags = {}
            for token in acs.group("flags").split():
                name, sign = token[:-1], token[-1:]
                if sign in "+-" and name:
                    flags[name] = sign == "+"
            result[current] = flags
    return result


def evaluate_acs(per_gpu):
    """per_gpu: [{"gpu": index, "pci_bus_id": str, "bridges": [{"bdf": str, "flags": dict|None}]}].

    Returns (p2p_risks, unknown_notes)."""
    risks, unknown = [], []
    for entry in per_gpu:
        for bridge in entry.get("bridges", []):
            flags = bridge.get("flags")
            if flags is None:
                continue
            if acs_redirects(flags):
                on = [name for name, _bit in ACS_BITS if flags.get(name)]
                risks.append("PCIe ACS redirect on bridge %s above GPU %s (%s): peer-to-peer traffic is sent to the "
                             "root complex (NCCL can hang); disable ACS in the BIOS or with setpci"
                             % (bridge["bdf"], entry.get("gpu"), " ".join(n + "+" for n in on)))
        if entry.get("bridges") and all(b.get("flags") is None for b in entry["bridges"]):
            unknown.append("ACS control not readable for the bridges above GPU %s (needs root for the extended "
                           "config space, or no ACS capability)" % entry.get("gpu"))
    return risks, unknown


# ---------------------------------------------------------------------------------------------------------------
# ECC / retired pages / remapped rows / recovery action

def evaluate_gpu_memory_health(gpu):
    """Blocking reasons and warnings for one GPU fact (from gpu_smi or gpu_nvml)."""
    blocking, warnings = [], []
    label = "GPU %s (%s, %s)" % (gpu.get("index"), gpu.get("uuid"), gpu.get("pci_bus_id"))
    ecc = gpu.get("ecc") or {}
    volatile = ecc.get("volatile_uncorrected")
    if volatile:
        blocking.append("%s: %d uncorrected ECC error(s) since the last driver load; reset the GPU and check "
                        "retired pages / remapped rows" % (label, volatile))
    aggregate = ecc.get("aggregate_uncorrected")
    if aggregate and not volatile:
        warnings.append("%s: %d uncorrected ECC error(s) over its lifetime" % (label, aggregate))
    if ecc.get("retired_pages_pending"):
        blocking.append("%s: page retirement pending; reset the GPU to retire the pages" % label)
    if ecc.get("remapped_rows_pending"):
        blocking.append("%s: row remapping pending; reset the GPU to activate the remapped rows" % label)
    if ecc.get("remapped_rows_failure"):
        blocking.append("%s: row remapping failed (no spare rows left); the GPU needs service" % label)
    if ecc.get("remapped_rows_uncorrectable"):
        warnings.append("%s: %d row(s) remapped after uncorrectable errors" % (label, ecc["remapped_rows_uncorrectable"]))
    if ecc.get("retired_pages_dbe"):
        warnings.append("%s: %d page(s) retired after double-bit errors" % (label, ecc["retired_pages_dbe"]))
    action = gpu.get("recovery_action")
    if action and action not in ("None", "N/A"):
        blocking.append("%s: the driver asks for recovery action %r" % (label, action))
    return blocking, warnings
