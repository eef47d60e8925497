# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPUs counted and identified from PCI sysfs before a driver exists: the table, declarations, bad input."""
from __future__ import annotations

import os

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_pci

MIB = 1024 * 1024


@pytest.fixture
def sysfs(fake_host):
    """sysfs(rows) -> the sysfs root of a fake host with these PCI devices."""
    return lambda rows: os.path.join(fake_host(rows), "sys")


DUAL_4090 = [
    ("0000:00:00.0", "0x8086", "0x7d01", "0x060000"),   # host bridge
    ("0000:01:00.0", "0x10de", "0x2684", "0x030000"),   # RTX 4090 (VGA)
    ("0000:01:00.1", "0x10de", "0x22ba", "0x040300"),   # its HDMI audio function: not a GPU
    ("0000:02:00.0", "0x10de", "0x2684", "0x030000"),
]


def test_dual_4090_from_sysfs(sysfs):
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(sysfs(DUAL_4090)))
    assert found["gpu_count"] == 2 and not found["errors"]
    assert [g["name"] for g in found["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2
    plan = gpu_pci.plan(found, 2)
    assert plan["ok"] and plan["gpu_memory_bytes"] == 24564 * MIB


def test_h200_3d_controller_class(sysfs):
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(sysfs([
        ("0000:00:06.0", "0x10de", "0x2335", "0x030200")])))
    assert found["gpus"][0]["name"] == "NVIDIA H200" and found["gpus"][0]["memory_bytes"] == 143771 * MIB


def test_fewer_gpus_than_tp_times_pp(sysfs):
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(sysfs(DUAL_4090[:2])))
    plan = gpu_pci.plan(found, 2, 1)
    assert not plan["ok"]
    (msg,) = plan["errors"]
    assert "needs tensor_parallel_size x pipeline_parallel_size = 2 x 1 = 2 GPUs" in msg
    assert "the PCI bus shows 1 NVIDIA GPU(s) (0000:01:00.0 NVIDIA GeForce RTX 4090)" in msg
    assert "lower onprem_vllm_tensor_parallel_size" in msg


def test_no_gpu_at_all(tmp_path):
    plan = gpu_pci.plan(gpu_pci.inventory(gpu_pci.read_pci_devices(str(tmp_path))), 1)
    assert "the PCI bus shows 0 NVIDIA GPU(s) (none)" in plan["errors"][0]


def test_unknown_device_id_asks_for_a_declaration(sysfs):
    root = sysfs([("0000:41:00.0", "0x10de", "0x2321", "0x030200")])
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(root))
    (msg,) = found["errors"]
    assert "0000:41:00.0 have PCI device id(s) 0x2321, which this collection's table does not know" in msg
    assert "plan_check_gpu_models: {'0x2321': {name:" in msg
    assert gpu_pci.plan(found, 1)["gpu_memory_bytes"] == 0


def test_declared_model_is_used(sysfs):
    root = sysfs([("0000:41:00.0", "0x10de", "0x2321", "0x030200")])
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(root),
                              {"0x2321": {"name": "NVIDIA H100 NVL", "memory_mib": 95830}})
    assert not found["errors"] and found["gpus"][0]["source"] == "inventory"
    assert gpu_pci.plan(found, 1)["gpu_memory_bytes"] == 95830 * MIB


def test_bad_declarations_are_refused():
    dummy, errors = gpu_pci.normalize_declared({"H100": {"memory_mib": 1}, "0x2321": {"name": "x", "memory_mib": "lots"}})
    assert "'H100' must map a PCI device id such as '0x2321'" in errors[0]
    assert "memory_mib must be the card's memory in MiB" in errors[1]


def test_tp_zero_is_refused(sysfs):
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(sysfs(DUAL_4090)))
    assert "must be at least 1" in gpu_pci.plan(found, 0)["errors"][0]


def test_gpus_and_nvswitches_for_the_driver_facts(sysfs):
    # NVSwitches are NVIDIA bridges (0x0680); another vendor's bridge and the GPU's audio function are neither.
    devices = gpu_pci.read_pci_devices(sysfs(DUAL_4090 + [
        ("0000:80:00.0", "0x10de", "0x22a3", "0x068000"), ("0000:81:00.0", "0x8086", "0x1234", "0x068000")]))
    assert [d["address"] for d in gpu_pci.nvidia_gpus(devices)] == ["0000:01:00.0", "0000:02:00.0"]
    assert gpu_pci.nvidia_gpus(devices)[0] == {"address": "0000:01:00.0", "vendor": "0x10de", "device": "0x2684",
                                               "class": "0x030000"}
    assert gpu_pci.nvswitch_count(devices) == 1
