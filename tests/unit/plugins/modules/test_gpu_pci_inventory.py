# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_pci_inventory module on a fake sysfs holding the two-H200 machine's PCI functions (addresses and device id
as read there: tests/unit/fixtures/gpu/h200-x2/SOURCE.md), in check mode, applied, and again; and its refusals."""
from __future__ import annotations

import os

import pytest

from ansible_collections.onprem.vllm.plugins.modules import gpu_pci_inventory

MIB = 1024 * 1024
TWO_H200 = [("0000:00:06.0", "0x10de", "0x2335", "0x030200"), ("0000:00:07.0", "0x10de", "0x2335", "0x030200")]


@pytest.fixture
def sysfs(fake_host):
    """sysfs(devices) -> the sysfs root of a fake host with these PCI devices."""
    return lambda devices: os.path.join(fake_host(devices), "sys")


@pytest.fixture
def inventory(call_module):
    return lambda sysfs_root, **args: call_module(gpu_pci_inventory, sysfs_root=sysfs_root, **args)


def test_check_apply_and_again_give_the_same_facts_and_change_nothing(sysfs, inventory):
    root = sysfs(TWO_H200)
    runs = [inventory(root, tensor_parallel_size=2, _ansible_check_mode=mode) for mode in (True, False, False)]
    for rc, result in runs:
        assert rc == 0 and result["changed"] is False and result["errors"] == []
        assert result["gpu_count"] == 2 and [g["address"] for g in result["gpus"]] == ["0000:00:06.0", "0000:00:07.0"]
        assert result["models"] == ["NVIDIA H200"] and result["needed"] == 2
        assert result["gpu_memory_bytes"] == 143771 * MIB
        assert result["msg"] == "2 NVIDIA GPU(s) on the PCI bus (NVIDIA H200); the plan needs 2"
    assert runs[0][1] == runs[1][1] == runs[2][1]


def test_more_gpus_than_the_bus_shows_fails_with_what_to_change(sysfs, inventory):
    rc, result = inventory(sysfs(TWO_H200[:1]), tensor_parallel_size=2)
    assert rc == 1 and result["failed"] and result["changed"] is False
    assert "2 x 1 = 2 GPUs" in result["msg"] and "the PCI bus shows 1 NVIDIA GPU(s) (0000:00:06.0 NVIDIA H200)" in result["msg"]


def test_misfit_reported_without_failing(sysfs, inventory):
    rc, result = inventory(sysfs(TWO_H200), tensor_parallel_size=2, pipeline_parallel_size=2, fail_on_misfit=False)
    assert rc == 0 and result["needed"] == 4 and len(result["errors"]) == 1


def test_an_unknown_card_is_named_by_its_declaration(sysfs, inventory):
    rc, result = inventory(sysfs([("0000:41:00.0", "0x10de", "0x2321", "0x030200")]),
                           declared_models={"0x2321": {"name": "NVIDIA H100 NVL", "memory_mib": 95830}})
    assert rc == 0 and result["models"] == ["NVIDIA H100 NVL"] and result["gpu_memory_bytes"] == 95830 * MIB


def test_no_sysfs_is_zero_gpus_and_a_clear_refusal(tmp_path, inventory):
    rc, result = inventory(str(tmp_path / "absent"))
    assert rc == 1 and result["gpu_count"] == 0 and "the PCI bus shows 0 NVIDIA GPU(s) (none)" in result["msg"]
