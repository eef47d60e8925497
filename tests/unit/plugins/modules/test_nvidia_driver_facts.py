# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the real nvidia_driver_facts module through the ansible CLI against fake /proc + /sys trees (host_root):
the H200's real loaded-driver text and PCI id, a Blackwell card with `proprietary` asked for, an NVSwitch system,
Secure Boot on, nouveau loaded, and a host with nothing."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.modules import nvidia_driver_facts

H200_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
                "GCC version:  gcc version 15.3.0 (GCC) \n")
BASE_ARGS = {"branch": "580", "os_family": "Debian", "distribution": "Ubuntu", "distribution_major_version": "24",
             "connection": "ssh"}


@pytest.fixture
def facts(run_module):
    """facts(host_root, check=False, **args): the module on a fake /proc + /sys tree."""
    def run(host_root, check=False, **args):
        return run_module("nvidia_driver_facts", dict(BASE_ARGS, host_root=host_root, **args), check=check)
    return run


H200_PCI = ("0000:00:06.0", "0x10de", "0x2335", "0x030200")


def test_h200_with_its_preinstalled_driver_is_skipped(facts, fake_host):
    result = facts(fake_host([H200_PCI], loaded=H200_VERSION, modules=["nvidia", "nvidia_uvm"]))
    assert result["changed"] is False
    assert result["driver_action"] == "skip" and result["loaded_version"] == "580.159.04"
    assert result["loaded_module_type"] == "open" and result["kernel_module_type"] == "open"
    assert result["gpus"] == [{"pci": "0000:00:06.0", "device_id": "0x2335", "arch": "hopper"}]
    assert result["errors"] == [] and result["reboot"]["needed"] is False


def test_blackwell_with_proprietary_is_refused_before_anything(facts, fake_host):
    result = facts(fake_host([("0000:01:00.0", "0x10de", "0x2b85", "0x030000")]),
                   kernel_module_type="proprietary")
    assert result["driver_action"] == "install" and result["kernel_module_type"] is None
    assert any("nvidia_driver_kernel_module_type: open" in e for e in result["errors"])


def test_wrong_branch_for_the_gpu(facts, fake_host):
    result = facts(fake_host([("0000:01:00.0", "0x10de", "0x2b85", "0x030000")]), branch="550")
    assert any("570 or newer" in e for e in result["errors"])


def test_nvswitch_system_gets_fabric_manager(facts, fake_host):
    devices = [("0000:%02x:00.0" % (0x10 + i), "0x10de", "0x2330", "0x030200") for i in range(2)]
    devices += [("0000:%02x:00.0" % (0x80 + i), "0x10de", "0x22a3", "0x068000") for i in range(4)]
    devices += [("0000:00:01.0", "0x8086", "0x1234", "0x060400")]  # not NVIDIA: ignored
    result = facts(fake_host(devices), source="cuda")
    assert result["gpu_count"] == 2 and result["nvswitch_count"] == 4
    assert result["fabricmanager"] is True and result["packages"]["fabricmanager"] == "nvidia-fabricmanager"
    assert result["errors"] == []


def test_nvswitch_on_debian_non_free_says_use_cuda(facts, fake_host):
    devices = [("0000:10:00.0", "0x10de", "0x2330", "0x030200"), ("0000:80:00.0", "0x10de", "0x22a3", "0x068000")]
    result = facts(fake_host(devices), distribution="Debian", distribution_major_version="12",
                   branch="535")
    assert any("nvidia_driver_source: cuda" in e for e in result["errors"])


def test_secure_boot_without_signing_path_stops(tmp_path, facts, fake_host):
    host = fake_host([("0000:01:00.0", "0x10de", "0x2684", "0x030000")], secure_boot=True)
    result = facts(host, source="cuda")
    assert result["secure_boot"] is True
    assert any("mokutil --import" in e for e in result["errors"])
    # Canonical's signed prebuilt modules are a signing path.
    result = facts(host, source="distribution")
    assert result["packages"]["signed_modules"] is True and result["errors"] == []
    # Secure Boot off in the EFI variable.
    (tmp_path / "off").mkdir()
    result = facts(fake_host(root=tmp_path / "off", secure_boot=False), source="cuda")
    assert result["secure_boot"] is False and result["errors"] == []


def test_nothing_present_degrades_to_clear_facts(facts, fake_host):
    result = facts(fake_host(), connection="community.docker.docker")
    assert result["loaded_version"] is None and result["gpu_count"] == 0 and result["nvswitch_count"] == 0
    assert result["secure_boot"] is False  # no EFI folder: legacy boot
    assert result["driver_action"] == "install" and result["action_reason"] == "no NVIDIA driver is loaded"
    assert result["kernel_module_type"] == "open"
    # Nothing installed (and a simulated root): no DKMS state to read, so nothing for the role to check.
    assert result["dkms"] == {"kernel": "", "modules": [], "built": None}


def test_nouveau_and_bad_request(facts, fake_host):
    result = facts(fake_host(modules=["nouveau", "drm"]), branch="58")
    assert result["nouveau_loaded"] is True
    assert any("three-digit branch" in e for e in result["errors"])


def test_parse_madison_and_dnf_streams():
    madison = (" nvidia-driver | 590.44.01-1 | http://127.0.0.1:8080/cuda/debian12/x86_64  Packages\n"
               " nvidia-driver | 580.105.08-1 | http://127.0.0.1:8080/cuda/debian12/x86_64  Packages\n"
               " nvidia-driver | 580.105.08-1 | http://mirror/  Packages\n")
    assert nvidia_driver_facts.parse_madison(madison) == ["590.44.01-1", "580.105.08-1"]
    assert nvidia_driver_facts.parse_madison("") == []
    dnf = ("cuda-rhel9-x86_64\nName           Stream             Profiles                       Summary\n"
           "nvidia-driver  latest             default [d], fm, ks, src       Nvidia driver for latest branch\n"
           "nvidia-driver  580-open [e]       default [d], fm, ks, src       Nvidia driver for 580-open branch\n"
           "nvidia-driver  580-dkms           default [d], fm, ks, src       Nvidia driver for 580-dkms branch\n")
    assert nvidia_driver_facts.parse_dnf_module_streams(dnf) == ["latest", "580-open", "580-dkms"]


def test_check_apply_and_again_report_the_same_read_only_facts(fake_host, facts):
    root = fake_host([H200_PCI], loaded=H200_VERSION, modules=["nvidia", "nvidia_uvm"])
    check, apply, again = (facts(root, check=mode) for mode in (True, False, False))
    for result in (check, apply, again):
        assert result["changed"] is False and not result.get("failed"), result.get("msg")
        assert result["driver_action"] == "skip" and result["loaded_version"] == "580.159.04"
    for key in ("gpus", "driver_action", "reboot", "errors"):
        assert check[key] == apply[key] == again[key], key
