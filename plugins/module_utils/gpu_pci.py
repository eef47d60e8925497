# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA GPUs counted and identified from PCI sysfs, before any driver exists (the plan check); the same scan gives
nvidia_driver_facts its GPUs and NVSwitches.

Reads <sysfs_root>/bus/pci/devices/*/{vendor,device,class}: vendor 0x10de, class 0x0300xx (VGA) or 0x0302xx (3D
controller); NVSwitches are NVIDIA bridges of class 0x0680xx. The device id names the card and its memory through
DEVICE_TABLE; an id that is not in the table needs an inventory declaration (plan_check_gpu_models) or the plan check
refuses it, since the KV plan needs the memory.

DEVICE_TABLE sources:
- Device ids: the PCI ID Repository (pci-ids.ucw.cz; Debian's pci.ids 2023.04.10 for 0x2204 "GA102 [GeForce RTX 3090]",
  0x2203 "RTX 3090 Ti", 0x2684 "AD102 [GeForce RTX 4090]", 0x20b0 "GA100 [A100 SXM4 40GB]", 0x20b2 "A100 SXM4 80GB",
  0x20b5 "A100 PCIe 80GB", 0x20f1 "A100 PCIe 40GB", 0x26b5 "AD102GL [L40]", 0x2330 "GH100 [H100 SXM5 80GB]",
  0x2331 "GH100 [H100 PCIe]", 0x2230 "GA102GL [RTX A6000]", 0x26b1 "RTX 6000 Ada Generation"); later entries of the same
  repository for 0x2b85 "GB202 [GeForce RTX 5090]" and 0x26b9 "AD102GL [L40S]" (as printed by `lspci -nn` on such
  hosts); 0x2335 "NVIDIA H200" from this collection's own recording on an H200 (tests/unit/fixtures/gpu/h200-x1,
  nvidia-smi -q: pci_device_id 0x233510DE).
- Memory: the total the driver reports (nvidia-smi "FB Memory Usage: Total", MiB) where a recorded output exists:
  H200 143771 (h200-x1, real), H100 80GB 81559 and RTX 5090 32607 and RTX 3090 24576 (fixtures dgx-h100-nvswitch,
  dual-5090-gns, quad-3090-nvlink-pairs, from the public reports they cite), RTX 4090 24564, L40S 46068 (public
  nvidia-smi outputs); else the datasheet size (A100 40/80 GB, RTX A6000, RTX 6000 Ada: 40960 / 81920 / 49140 / 49140 MiB; the
  L40 taken as the L40S figure, the same 48 GB card memory), an upper bound the full GPU preflight replaces with the exact figure once the driver is in.
"""

from __future__ import annotations

import glob
import os

NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
NVSWITCH_CLASS_PREFIX = "0x0680"
MIB = 1024 * 1024

# device id -> (model name, memory MiB)
DEVICE_TABLE = {
    0x2204: ("NVIDIA GeForce RTX 3090", 24576),
    0x2203: ("NVIDIA GeForce RTX 3090 Ti", 24576),
    0x2684: ("NVIDIA GeForce RTX 4090", 24564),
    0x2B85: ("NVIDIA GeForce RTX 5090", 32607),
    0x2230: ("NVIDIA RTX A6000", 49140),
    0x26B1: ("NVIDIA RTX 6000 Ada Generation", 49140),
    0x26B5: ("NVIDIA L40", 46068),
    0x26B9: ("NVIDIA L40S", 46068),
    0x20B0: ("NVIDIA A100-SXM4-40GB", 40960),
    0x20F1: ("NVIDIA A100-PCIE-40GB", 40960),
    0x20B2: ("NVIDIA A100-SXM4-80GB", 81920),
    0x20B5: ("NVIDIA A100 80GB PCIe", 81920),
    0x2330: ("NVIDIA H100 80GB HBM3", 81559),
    0x2331: ("NVIDIA H100 PCIe", 81559),
    0x2335: ("NVIDIA H200", 143771),
}


def _read(path):
    try:
        with open(path, "r") as handle:
            return handle.read().strip().lower()
    except (OSError, UnicodeDecodeError):
        return ""


def read_pci_devices(sysfs_root="/sys"):
    """Every PCI device under <sysfs_root>/bus/pci/devices as {'address', 'vendor', 'device', 'class'} (strings as
    sysfs writes them, lower case)."""
    devices = []
    for path in sorted(glob.glob(os.path.join(sysfs_root, "bus", "pci", "devices", "*"))):
        devices.append({"address": os.path.basename(path), "vendor": _read(os.path.join(path, "vendor")),
                        "device": _read(os.path.join(path, "device")), "class": _read(os.path.join(path, "class"))})
    return devices


def nvidia_gpus(devices):
    """The NVIDIA GPUs (VGA or 3D controller class) among read_pci_devices' devices, in their order."""
    return [dev for dev in devices
            if dev.get("vendor") == NVIDIA_VENDOR and str(dev.get("class", "")).startswith(GPU_CLASS_PREFIXES)]


def nvswitch_count(devices):
    """How many NVSwitches (NVIDIA bridges, class 0x0680) are among read_pci_devices' devices."""
    return sum(1 for dev in devices
               if dev.get("vendor") == NVIDIA_VENDOR and str(dev.get("class", "")).startswith(NVSWITCH_CLASS_PREFIX))


def _device_id(text):
    try:
        return int(str(text), 16)
    except (TypeError, ValueError):
        return None


def normalize_declared(declared):
    """plan_check_gpu_models: {'0x2321': {'name': 'NVIDIA H100 NVL', 'memory_mib': 95830}} ->
    ({0x2321: (name, MiB)}, errors)."""
    table, errors = {}, []
    for key, value in (declared or {}).items():
        device = _device_id(key)
        if device is None or not isinstance(value, dict):
            errors.append("plan_check_gpu_models: %r must map a PCI device id such as '0x2321' to {name: ..., "
                          "memory_mib: ...}" % (key,))
            continue
        try:
            memory = int(value.get("memory_mib", 0))
        except (TypeError, ValueError):
            memory = 0
        if memory <= 0:
            errors.append("plan_check_gpu_models[%r]: memory_mib must be the card's memory in MiB (as nvidia-smi "
                          "reports it), got %r" % (key, value.get("memory_mib")))
            continue
        table[device] = (str(value.get("name") or "NVIDIA GPU 0x%04x" % device), memory)
    return table, errors


def inventory(devices, declared=None):
    """NVIDIA GPUs among the PCI devices. Returns dict(gpus, gpu_count, unknown, errors); each gpu has address,
    device_id, name, memory_bytes and source (table | inventory)."""
    declared_table, errors = normalize_declared(declared)
    gpus, unknown = [], []
    for dev in nvidia_gpus(devices):
        device = _device_id(dev.get("device"))
        label = "0x%04x" % device if device is not None else str(dev.get("device"))
        if device in declared_table:
            name, mib = declared_table[device]
            source = "inventory"
        elif device in DEVICE_TABLE:
            name, mib = DEVICE_TABLE[device]
            source = "table"
        else:
            unknown.append({"address": dev["address"], "device_id": label})
            continue
        gpus.append({"address": dev["address"], "device_id": label, "name": name, "memory_bytes": mib * MIB,
                     "source": source})
    if unknown:
        ids = sorted({u["device_id"] for u in unknown})
        addresses = ", ".join(u["address"] for u in unknown)
        errors.append("NVIDIA GPU(s) at %s have PCI device id(s) %s, which this collection's table does not know: "
                      "declare each in plan_check_gpu_models, e.g. plan_check_gpu_models: {'%s': {name: 'NVIDIA ...', "
                      "memory_mib: <total nvidia-smi reports>}}" % (addresses, ", ".join(ids), ids[0]))
    return {"gpus": gpus, "gpu_count": len(gpus) + len(unknown), "unknown": unknown, "errors": errors}


def plan(found, tensor_parallel_size, pipeline_parallel_size=1):
    """Enough GPUs for TP x PP? Returns dict(ok, needed, gpu_memory_bytes (the smallest of the GPUs the plan would
    use), models, errors)."""
    needed = int(tensor_parallel_size) * int(pipeline_parallel_size)
    errors = list(found["errors"])
    result = {"needed": needed, "gpu_memory_bytes": 0, "models": sorted({g["name"] for g in found["gpus"]})}
    if needed < 1:
        errors.append("tensor_parallel_size x pipeline_parallel_size must be at least 1 (got %d x %d)"
                      % (int(tensor_parallel_size), int(pipeline_parallel_size)))
    elif found["gpu_count"] < needed:
        listing = ", ".join("%s %s" % (g["address"], g["name"]) for g in found["gpus"]) or "none"
        errors.append("the plan needs tensor_parallel_size x pipeline_parallel_size = %d x %d = %d GPUs, and the PCI "
                      "bus shows %d NVIDIA GPU(s) (%s): lower onprem_vllm_tensor_parallel_size / "
                      "onprem_vllm_pipeline_parallel_size to fit, or serve this model on a host with %d GPUs"
                      % (int(tensor_parallel_size), int(pipeline_parallel_size), needed, found["gpu_count"], listing,
                         needed))
    elif not found["unknown"]:
        # The GPU preflight picks the best-connected set later; the smallest card bounds any choice.
        result["gpu_memory_bytes"] = min(g["memory_bytes"] for g in found["gpus"])
    result["errors"] = errors
    result["ok"] = not errors
    return result
