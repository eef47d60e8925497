#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_info
short_description: Check what breaks GPU serving before a rollout - Xid events, ECC, IOMMU, PCIe ACS, driver mismatch
version_added: 0.1.0
description:
  - Read-only. Collects the GPUs through the same backends as M(onprem.vllm.gpu_topology_info) and checks
    uncorrected ECC errors, pending page retirement, remapped rows and the driver's recovery action per GPU,
    an NVML C(Driver/library version mismatch) (typical after an unattended driver upgrade without reboot),
    Xid events in the kernel log (journal, dmesg, or a given file), the IOMMU mode (kernel command line and
    C(/sys/class/iommu)) and PCIe ACS control on the bridges above each GPU (sysfs config space, else C(lspci -vvv)).
  - Returns C(blocking) with C(reasons) (what must be fixed before a rollout), C(warnings_list) (worth a look),
    and C(p2p_risks) (host settings that make PCIe peer-to-peer unsafe; pass them to
    M(onprem.vllm.gpu_topology_info) O(onprem.vllm.gpu_topology_info#module:p2p_risks)).
  - The Xid severity table and its sources are documented in the module_utils file C(gpu_health_checks.py) and in
    C(docs/gpu_preflight.md).
author:
  - onprem.vllm developers (@onprem)
extends_documentation_fragment:
  - onprem.vllm.read_only
  - onprem.vllm.gpu_source
options:
  kernel_log_path:
    description:
      - Read Xid events from this file (for example C(/var/log/kern.log) or a recorded log) instead of the journal
        or dmesg. An unreadable file fails the module with a clear message.
    type: path
  kernel_log_source:
    description:
      - Where to read the kernel log when O(kernel_log_path) is not set. C(auto) tries C(journalctl -k -b 0),
        then C(dmesg). C(none) skips the Xid check.
    type: str
    choices: [auto, journal, dmesg, none]
    default: auto
  ignore_xids:
    description:
      - Xid codes to leave out (for example a known application fault).
    type: list
    elements: int
    default: []
  xids_after:
    description:
      - Only Xid events logged after this time count (seconds since the epoch, or ISO 8601 with its offset, e.g.
        C(2026-12-05T09:00:02+00:00)); those logged at or before it are left out (C(kernel_log.xids_left_out)).
        C(playbooks/gpu_return.yml) passes the time of the GPU fault that took the host out, so a GPU reset without a
        reboot can return while the fault's Xids are still in this boot's log.
      - The journal's lines carry their time; dmesg's seconds since boot are read against the boot time
        (C(/proc/stat) C(btime)). A line whose time is not in it (a syslog or C(dmesg --ctime) stamp, which has no
        year or zone, or no stamp) still counts.
    type: str
  gpu_uuids:
    description:
      - Only check these GPUs. A UUID that is not present fails the module with a clear message.
    type: list
    elements: str
  check_acs:
    description:
      - Read PCIe ACS control on the bridges above each GPU.
    type: bool
    default: true
  host_root:
    description:
      - Root under which C(/proc/cmdline), C(/sys/class/iommu) and C(/sys/bus/pci) are read. Only tests and
        chroots need another value.
    type: path
    default: /
notes:
  - Check mode is supported; the module never changes anything.
  - Reading the kernel log and the PCIe extended config space usually needs root (C(become)).
  - Xid events older than the current boot are only seen through O(kernel_log_path).
seealso:
  - module: onprem.vllm.gpu_topology_info
"""

EXAMPLES = r"""
- name: Check GPU health
  onprem.vllm.gpu_health_info:
  become: true
  register: health

- name: Replay a recorded kernel log
  onprem.vllm.gpu_health_info:
    kernel_log_path: /tmp/kern.log
  register: health

- name: Stop when a GPU is unhealthy
  ansible.builtin.assert:
    that: not health.blocking
    fail_msg: "{{ health.reasons | join('; ') }}"
"""

RETURN = r"""
blocking:
  description: True when at least one finding must be fixed before serving.
  returned: always
  type: bool
  sample: false
reasons:
  description: The blocking findings, one line each.
  returned: always
  type: list
  elements: str
warnings_list:
  description: Non-blocking findings and checks that could not run.
  returned: always
  type: list
  elements: str
p2p_risks:
  description: Host settings that make PCIe peer-to-peer unsafe (ACS redirect, translating IOMMU).
  returned: always
  type: list
  elements: str
status:
  description: Collection status of the GPU backend (ok, no_gpu, no_driver, no_nvml, driver_library_mismatch, gpu_lost, error).
  returned: always
  type: str
  sample: ok
msg:
  description: One-line summary.
  returned: always
  type: str
backend:
  description: The backend used for GPU facts.
  returned: always
  type: str
driver_library_mismatch:
  description: True when NVML or nvidia-smi report C(Driver/library version mismatch).
  returned: always
  type: bool
gpus:
  description: Per checked GPU - index, uuid, pci_bus_id, ecc counters and recovery_action.
  returned: always
  type: list
  elements: dict
xid_events:
  description:
    - Xid events found in the kernel log, oldest first - code, pci_bus_id, message, severity (block, warn, info),
      description and log_prefix (the timestamp and host part of the line).
  returned: always
  type: list
  elements: dict
kernel_log:
  description:
    - Where the kernel log came from (source), whether it was read (readable), lines read and a message.
    - With O(xids_after), also xids_after (as given) and xids_left_out (the Xid events logged at or before it).
  returned: always
  type: dict
iommu:
  description: IOMMU mode (off, passthrough, translated, unknown), reason, cmdline_flags and units.
  returned: always
  type: dict
acs:
  description: Per GPU, the bridges above it with their ACS control flags (null when unreadable).
  returned: always
  type: list
  elements: dict
elapsed_s:
  description: Seconds spent, measured inside the module.
  returned: always
  type: float
"""

import os
import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_health_checks as checks
from ansible_collections.onprem.vllm.plugins.module_utils import gpu_nvml
from ansible_collections.onprem.vllm.plugins.module_utils.gpu_smi import normalize_pci_bus_id

ARGUMENT_SPEC = dict(
    backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
    nvidia_smi_path=dict(type="path"),
    kernel_log_path=dict(type="path"),
    kernel_log_source=dict(type="str", default="auto", choices=["auto", "journal", "dmesg", "none"]),
    ignore_xids=dict(type="list", elements="int", default=[]),
    xids_after=dict(type="str"),
    gpu_uuids=dict(type="list", elements="str"),
    check_acs=dict(type="bool", default=True),
    host_root=dict(type="path", default="/"),
)

_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def read_kernel_log(module, params):
    """Returns (text or None, info dict)."""
    path = params["kernel_log_path"]
    if path:
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError as exc:
            module.fail_json(msg="kernel_log_path %s is not readable: %s" % (path, exc.strerror or exc))
        return text, {"source": "file:%s" % path, "readable": True, "msg": "read %s" % path}
    source = params["kernel_log_source"]
    if source == "none":
        return None, {"source": "none", "readable": False, "msg": "kernel log check skipped (kernel_log_source=none)"}
    tried = []
    if source in ("auto", "journal"):
        journalctl = module.get_bin_path("journalctl")
        if journalctl:
            rc, out, err = module.run_command([journalctl, "-k", "-b", "0", "--no-pager", "-q", "-o", "short-iso"])
            if rc == 0:
                return out, {"source": "journal", "readable": True, "msg": "journalctl -k -b 0"}
            tried.append("journalctl -k -b 0: rc=%s %s" % (rc, (err or out).strip()[:160]))
        else:
            tried.append("journalctl not found")
    if source in ("auto", "dmesg"):
        dmesg = module.get_bin_path("dmesg")
        if dmesg:
            rc, out, err = module.run_command([dmesg])
            if rc == 0:
                return out, {"source": "dmesg", "readable": True, "msg": "dmesg"}
            tried.append("dmesg: rc=%s %s" % (rc, (err or out).strip()[:160]))
        else:
            tried.append("dmesg not found")
    return None, {"source": source, "readable": False,
                  "msg": "kernel log not readable (%s); run with become: true or set kernel_log_path" % "; ".join(tried)}


def read_boot_time(host_root):
    """When this boot began (seconds since the epoch, /proc/stat btime); None when it cannot be read."""
    try:
        with open(os.path.join(host_root, "proc/stat")) as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def bridges_above(host_root, bus_id):
    """PCI bridges between the root complex and a GPU, from the sysfs device path."""
    bdf = normalize_pci_bus_id(bus_id)
    link = os.path.join(host_root, "sys/bus/pci/devices", bdf)
    if not os.path.exists(link):
        return None
    parts = os.path.realpath(link).split(os.sep)
    return [p for p in parts[:-1] if _BDF_RE.match(p)]


def read_acs(module, host_root, bdf, lspci_cache):
    try:
        with open(os.path.join(host_root, "sys/bus/pci/devices", bdf, "config"), "rb") as handle:
            config = handle.read()
    except OSError:
        config = None
    flags = checks.parse_acs_from_config(config)
    if flags is not None or (config is not None and len(config) >= 4096):
        return flags, "sysfs"
    if host_root not in ("/", ""):
        return None, "unreadable"
    if "lspci" not in lspci_cache:
        lspci_cache["lspci"] = module.get_bin_path("lspci")
    lspci = lspci_cache["lspci"]
    if not lspci:
        return None, "unreadable"
    rc, out, _err = module.run_command([lspci, "-vvv", "-s", bdf])
    if rc != 0:
        return None, "unreadable"
    parsed = checks.parse_lspci_acs(out)
    return parsed.get(bdf), "lspci"


def run_module(module):
    params = module.params
    started = time.monotonic()
    host_root = params["host_root"]
    smi_path = params["nvidia_smi_path"]
    if smi_path and not os.path.exists(smi_path):
        module.fail_json(msg="nvidia_smi_path %s does not exist" % smi_path)
    if not smi_path:
        smi_path = module.get_bin_path("nvidia-smi")

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    collected = gpu_nvml.collect_topology(params["backend"], run, smi_path, host_root)
    facts = collected["facts"] or {}
    gpus = facts.get("gpus") or []
    reasons, warnings = [], list(collected["warnings"])
    status = collected["status"]
    mismatch = status == "driver_library_mismatch"
    if mismatch:
        reasons.append("Driver/library version mismatch: the loaded kernel module and the user-space driver differ "
                       "(an unattended upgrade without reboot?); reboot or reload the nvidia modules (%s)" % collected["msg"])
    elif status == "gpu_lost":
        reasons.append("a GPU is lost or unreachable: %s" % collected["msg"])
    elif status == "error":
        reasons.append("GPU query failed: %s" % collected["msg"])
    elif status == "no_permission":
        warnings.append(collected["msg"])

    if params["gpu_uuids"]:
        present = {g.get("uuid"): g for g in gpus}
        missing = [u for u in params["gpu_uuids"] if u not in present]
        if missing and status == "ok":
            module.fail_json(msg="gpu_uuids names GPU(s) not present on this host: %s; present: %s" % (
                ", ".join(missing), ", ".join(present) or "none"))
        checked = [present[u] for u in params["gpu_uuids"] if u in present]
    else:
        checked = gpus

    for gpu in checked:
        block, warn = checks.evaluate_gpu_memory_health(gpu)
        reasons.extend(block)
        warnings.extend(warn)

    # Kernel log / Xid
    xids_after = None
    if params["xids_after"]:
        try:
            xids_after = checks.parse_time(params["xids_after"])
        except ValueError as exc:
            module.fail_json(msg="xids_after: %s" % exc)
    text, log_info = read_kernel_log(module, params)
    events = []
    if text is not None:
        events = checks.parse_xid_events(text, ignore=params["ignore_xids"])
        log_info["lines"] = text.count("\n")
        counted = events
        if xids_after is not None:
            boot_time = read_boot_time(host_root) if log_info["source"] == "dmesg" else None
            counted, left_out = checks.xids_logged_after(events, xids_after, boot_time)
            log_info.update(xids_after=params["xids_after"], xids_left_out=len(left_out))
        bus_filter = None
        if params["gpu_uuids"]:
            known = set(normalize_pci_bus_id(g.get("pci_bus_id")) for g in gpus)
            wanted = set(normalize_pci_bus_id(g.get("pci_bus_id")) for g in checked)
            # keep events of the chosen GPUs and of GPUs that are gone (a GPU lost by Xid 79 is no longer listed)
            bus_filter = wanted | set(e["pci_bus_id"] for e in events if e["pci_bus_id"] not in known)
        block, warn = checks.summarize_xids(counted, bus_filter)
        reasons.extend(block)
        warnings.extend(warn)
    elif gpus:
        warnings.append(log_info["msg"])

    # IOMMU
    try:
        with open(os.path.join(host_root, "proc/cmdline")) as handle:
            cmdline = handle.read()
    except OSError:
        cmdline = ""
    try:
        units = os.listdir(os.path.join(host_root, "sys/class/iommu"))
    except OSError:
        units = None
    iommu = checks.evaluate_iommu(cmdline, units)
    p2p_risks = []
    if iommu["mode"] == "translated" and len(gpus) > 1:
        p2p_risks.append(iommu["reason"])

    # ACS
    acs = []
    if params["check_acs"]:
        cache = {}
        for gpu in checked:
            bridges = bridges_above(host_root, gpu.get("pci_bus_id"))
            entry = {"gpu": gpu.get("index"), "pci_bus_id": gpu.get("pci_bus_id"), "bridges": []}
            for bdf in bridges or []:
                flags, how = read_acs(module, host_root, bdf, cache)
                entry["bridges"].append({"bdf": bdf, "flags": flags, "read_by": how})
            acs.append(entry)
        risks, unknown = checks.evaluate_acs(acs)
        if len(gpus) > 1:
            p2p_risks.extend(risks)
            warnings.extend(unknown)

    blocking = bool(reasons)
    if not gpus and status in ("no_driver", "no_nvml", "no_gpu"):
        msg = "no NVIDIA GPU: %s" % collected["msg"]
    elif blocking:
        msg = "%d blocking finding(s): %s" % (len(reasons), reasons[0])
    else:
        msg = "%d GPU(s) checked, nothing blocking (%d warning(s))" % (len(checked), len(warnings))
    module.exit_json(
        changed=False,
        blocking=blocking,
        reasons=reasons,
        warnings_list=warnings,
        p2p_risks=p2p_risks,
        status=status,
        msg=msg,
        backend=collected["backend"],
        driver_library_mismatch=mismatch,
        gpus=[{"index": g.get("index"), "uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id"),
               "ecc": g.get("ecc"), "recovery_action": g.get("recovery_action")} for g in checked],
        xid_events=events,
        kernel_log=log_info,
        iommu=iommu,
        acs=acs,
        elapsed_s=round(time.monotonic() - started, 4),
    )


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        run_module(module)
    except Exception as exc:  # a clear message instead of a bare traceback
        module.fail_json(msg="gpu_health_info failed unexpectedly: %s" % exc, exception=traceback.format_exc())


if __name__ == "__main__":
    main()
