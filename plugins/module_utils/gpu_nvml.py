# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts through NVML (the nvidia-ml-py package, imported as ``pynvml``), in the same shape as gpu_smi.

The import is guarded: when nvidia-ml-py is missing, ``HAS_PYNVML`` is False and ``PYNVML_IMPORT_ERROR``
says why; callers fall back to the nvidia-smi backend or report the message.
"""

from __future__ import annotations

import itertools
import os
import re

from ansible_collections.onprem.vllm.plugins.module_utils.gpu_smi import (
    detect_nvswitch,
    normalize_pci_bus_id,
)

try:
    import pynvml  # provided by the nvidia-ml-py distribution

    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except Exception as _exc:  # pragma: no cover - depends on the target host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = "nvidia-ml-py (module pynvml) is not importable on the target: %s" % _exc

# NVML enum values (nvml.h); spelled out because some pynvml releases wrap a few of them in tuples.
_P2P_READ, _P2P_WRITE, _P2P_NVLINK = 0, 1, 2
_P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
_TOPOLOGY = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_GPU_IS_LOST = 15
_ERR_LIB_RM_VERSION_MISMATCH = 18
_NVLINK_DEVICE_TYPE_SWITCH = 2
_NVLINK_MAX_LINKS = 18
_FABRIC_STATE = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Completed"}


def _str(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _call(func, *args, **kwargs):
    """Call an NVML function; None when the GPU/driver does not support it."""
    try:
        return func(*args, **kwargs)
    except Exception:  # NVMLError_NotSupported, NoPermission, FunctionNotFound, ...
        return None


def status_from_nvml_error(exc):
    """Map an NVMLError from nvmlInit to (status, message)."""
    value = getattr(exc, "value", None)
    text = str(exc)
    if value == _ERR_LIB_RM_VERSION_MISMATCH:
        return "driver_library_mismatch", "NVML: Driver/library version mismatch (%s); reboot or reload the nvidia kernel module" % text
    if value == _ERR_LIBRARY_NOT_FOUND:
        return "no_driver", "no NVIDIA driver: NVML library (libnvidia-ml.so.1) not found"
    if value == _ERR_DRIVER_NOT_LOADED:
        return "no_driver", "no NVIDIA driver: NVML says the driver is not loaded"
    if value == _ERR_GPU_IS_LOST:
        return "gpu_lost", "NVML: %s" % text
    return "error", "NVML initialisation failed: %s" % text


def _numa_node(handle, bus_id, host_root):
    value = _call(pynvml.nvmlDeviceGetNumaNodeId, handle) if hasattr(pynvml, "nvmlDeviceGetNumaNodeId") else None
    if isinstance(value, int) and value >= 0:
        return value
    return read_sysfs_numa_node(bus_id, host_root)


def read_sysfs_numa_node(bus_id, host_root="/"):
    """NUMA node of a PCI device from sysfs; None when the platform reports -1 or the file is missing."""
    path = os.path.join(host_root, "sys/bus/pci/devices", normalize_pci_bus_id(bus_id) or "", "numa_node")
    try:
        with open(path) as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    if value >= 0:
        return value
    # -1: the platform has no NUMA information for the device. With a single NUMA node (VMs, one-socket desktops)
    # nvidia-smi topo -m reports node 0; do the same so both backends agree.
    try:
        nodes = [n for n in os.listdir(os.path.join(host_root, "sys/devices/system/node")) if re.match(r"^node\d+$", n)]
    except OSError:
        return None
    return int(nodes[0][4:]) if len(nodes) == 1 else None


def _process_name(pid):
    name = _str(_call(pynvml.nvmlSystemGetProcessName, pid))
    if name:
        return os.path.basename(name)
    try:
        with open("/proc/%d/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _processes(handle):
    out = []
    seen = set()
    for kind, func_name in (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
        func = getattr(pynvml, func_name, None)
        for proc in (_call(func, handle) if func else None) or []:
            pid = getattr(proc, "pid", None)
            if (pid, kind) in seen:
                continue
            seen.add((pid, kind))
            used = getattr(proc, "usedGpuMemory", None)
            out.append({
                "pid": pid,
                "name": _process_name(pid) if pid is not None else None,
                "type": kind,
                "used_memory_bytes": used if isinstance(used, int) and used >= 0 else None,
            })
    return out


def _ecc(handle):
    mode = _call(pynvml.nvmlDeviceGetEccMode, handle)
    enabled = bool(mode[0]) if isinstance(mode, (list, tuple)) and mode else None
    volatile = _call(pynvml.nvmlDeviceGetTotalEccErrors, handle, 1, 0) if enabled else None
    aggregate = _call(pynvml.nvmlDeviceGetTotalEccErrors, handle, 1, 1) if enabled else None
    sbe = _call(pynvml.nvmlDeviceGetRetiredPages, handle, 0)
    dbe = _call(pynvml.nvmlDeviceGetRetiredPages, handle, 1)
    pending = _call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    remapped = _call(pynvml.nvmlDeviceGetRemappedRows, handle)
    if not isinstance(remapped, (list, tuple)) or len(remapped) < 4:
        remapped = (None, None, None, None)
    return {
        "mode_enabled": enabled,
        "volatile_uncorrected": volatile,
        "aggregate_uncorrected": aggregate,
        "retired_pages_sbe": len(sbe) if isinstance(sbe, (list, tuple)) else None,
        "retired_pages_dbe": len(dbe) if isinstance(dbe, (list, tuple)) else None,
        "retired_pages_pending": bool(pending) if pending is not None else None,
        "remapped_rows_correctable": remapped[0],
        "remapped_rows_uncorrectable": remapped[1],
        "remapped_rows_pending": bool(remapped[2]) if remapped[2] is not None else None,
        "remapped_rows_failure": bool(remapped[3]) if remapped[3] is not None else None,
    }


def _nvlinks(handle):
    """Active NVLinks of a GPU: list of (remote normalized bus id, remote is switch)."""
    links = []
    for link in range(_NVLINK_MAX_LINKS):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:
            break  # NotSupported on GPUs without NVLink, InvalidArgument past the last link
        if not state:
            continue
        remote = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        remote_bus = normalize_pci_bus_id(_str(getattr(remote, "busId", None))) if remote is not None else None
        remote_type = None
        if hasattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
            remote_type = _call(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        links.append((remote_bus, remote_type == _NVLINK_DEVICE_TYPE_SWITCH))
    return links


def collect(host_root="/"):
    """Collect the topology fact through NVML. Returns (facts or None, status, message, warnings)."""
    if not HAS_PYNVML:
        return None, "no_nvml", PYNVML_IMPORT_ERROR, []
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        status, msg = status_from_nvml_error(exc)
        return None, status, msg, []
    warnings = []
    try:
        driver = _str(_call(pynvml.nvmlSystemGetDriverVersion))
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _call(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_text = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10) if isinstance(cuda, int) else None
        count = pynvml.nvmlDeviceGetCount()
        handles = []
        gpus = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                status, msg = status_from_nvml_error(exc)
                if status == "error":
                    status = "gpu_lost"
                return None, status, "NVML cannot open GPU %d: %s" % (index, exc), warnings
            handles.append(handle)
            pci = _call(pynvml.nvmlDeviceGetPciInfo, handle)
            bus_id = _str(getattr(pci, "busId", None)) if pci is not None else None
            memory = None
            if hasattr(pynvml, "nvmlMemory_v2"):
                memory = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, version=pynvml.nvmlMemory_v2)
            reserved = getattr(memory, "reserved", None) if memory is not None else None
            if memory is None:
                memory = _call(pynvml.nvmlDeviceGetMemoryInfo, handle)
            cc = _call(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
            persistence = _call(pynvml.nvmlDeviceGetPersistenceMode, handle)
            mig = _call(pynvml.nvmlDeviceGetMigMode, handle)
            fabric = _call(pynvml.nvmlDeviceGetGpuFabricInfo, handle) if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfo") else None
            fabric_state = _FABRIC_STATE.get(getattr(fabric, "state", None)) if fabric is not None else None
            gpus.append({
                "index": index,
                "uuid": _str(_call(pynvml.nvmlDeviceGetUUID, handle)),
                "name": _str(_call(pynvml.nvmlDeviceGetName, handle)),
                "architecture": None,
                "pci_bus_id": bus_id,
                "memory_total_bytes": getattr(memory, "total", None),
                "memory_used_bytes": getattr(memory, "used", None),
                "memory_reserved_bytes": reserved,
                "compute_capability": "%d.%d" % tuple(cc) if isinstance(cc, (list, tuple)) and len(cc) == 2 else None,
                "compute_capability_source": "nvml" if cc else None,
                "pcie_gen": _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                "pcie_width": _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
                "pcie_gen_max": _call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                "pcie_width_max": _call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                "numa_node": _numa_node(handle, bus_id, host_root),
                "cpu_affinity": None,
                "persistence_mode": bool(persistence) if persistence is not None else None,
                "mig_mode": bool(mig[0]) if isinstance(mig, (list, tuple)) and mig else None,
                "processes": _processes(handle),
                "ecc": _ecc(handle),
                "recovery_action": None,
                "fabric_state": fabric_state,
            })
        nvlinks = [_nvlinks(h) for h in handles]
        bus_to_index = {normalize_pci_bus_id(g["pci_bus_id"]): g["index"] for g in gpus}
        links = {}
        for i, j in itertools.combinations(range(count), 2):
            direct = sum(1 for remote, _sw in nvlinks[i] if bus_to_index.get(remote) == j)
            switch_i = sum(1 for _r, sw in nvlinks[i] if sw)
            switch_j = sum(1 for _r, sw in nvlinks[j] if sw)
            nv = direct or (min(switch_i, switch_j) if switch_i and switch_j else 0)
            if nv:
                link_type = "NV%d" % nv
            else:
                ancestor = _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
                link_type = _TOPOLOGY.get(ancestor)
            statuses = {}
            for key, idx in (("p2p_read", _P2P_READ), ("p2p_write", _P2P_WRITE), ("p2p_nvlink", _P2P_NVLINK)):
                value = _call(pynvml.nvmlDeviceGetP2PStatus, handles[i], handles[j], idx)
                statuses[key] = _P2P_STATUS.get(value) if value is not None else None
            links["%d-%d" % (i, j)] = dict(type=link_type, nvlink_count=nv, **statuses)
        host_evidence = []
        if any(sw for per_gpu in nvlinks for _r, sw in per_gpu):
            host_evidence.append("NVML reports an NVSwitch at the far end of an NVLink")
        host_evidence.extend(nvswitch_host_evidence(host_root))
        facts = {
            "driver_version": driver,
            "cuda_driver_version": cuda_text,
            "gpus": gpus,
            "links": links,
            "nvswitch": detect_nvswitch(gpus, links, host_evidence),
        }
        if not gpus:
            return facts, "no_gpu", "NVML found no NVIDIA GPU", warnings
        return facts, "ok", "NVML: %d GPU(s)" % len(gpus), warnings
    finally:
        _call(pynvml.nvmlShutdown)


def nvswitch_host_evidence(host_root="/"):
    """Host-side NVSwitch evidence: the nvswitch driver's /proc folder or /dev nodes."""
    evidence = []
    proc = os.path.join(host_root, "proc/driver/nvidia-nvswitch/devices")
    try:
        entries = os.listdir(proc)
    except OSError:
        entries = []
    if entries:
        evidence.append("%d NVSwitch device(s) under /proc/driver/nvidia-nvswitch/devices" % len(entries))
    try:
        dev = [e for e in os.listdir(os.path.join(host_root, "dev")) if e.startswith("nvidia-nvswitch") and e != "nvidia-nvswitchctl"]
    except OSError:
        dev = []
    if dev and not entries:
        evidence.append("%d /dev/nvidia-nvswitch* device node(s)" % len(dev))
    return evidence


def collect_topology(backend, run, smi_path, host_root="/"):
    """Dispatch to a backend. backend: auto | nvml | nvidia-smi; smi_path None means nvidia-smi was not found.

    Returns dict(facts, status, msg, warnings, backend)."""
    from ansible_collections.onprem.vllm.plugins.module_utils import gpu_smi

    warnings = []
    if backend in ("auto", "nvml"):
        facts, status, msg, more = collect(host_root)
        warnings.extend(more)
        if backend == "nvml" or status in ("ok", "no_gpu") or (status != "no_nvml" and not smi_path):
            return dict(facts=facts, status=status, msg=msg, warnings=warnings, backend="nvml")
        warnings.append(msg)
    if not smi_path:
        status = "no_driver"
        msg = "no NVIDIA GPU found: nvidia-smi is not on PATH and nvidia-ml-py is not importable"
        if backend == "nvidia-smi":
            msg = "nvidia-smi not found (set nvidia_smi_path); no NVIDIA driver on this host?"
        return dict(facts=None, status=status, msg=msg, warnings=warnings, backend="nvidia-smi")
    facts, status, msg, more = gpu_smi.collect(run, smi_path)
    warnings.extend(more)
    if facts is not None:
        evidence = nvswitch_host_evidence(host_root)
        if evidence:
            facts["nvswitch"] = detect_nvswitch(facts["gpus"], facts["links"], evidence)
    return dict(facts=facts, status=status, msg=msg, warnings=warnings, backend="nvidia-smi")
