# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's pure decisions: architecture by PCI id, open/proprietary, branch fit, package plans per
distribution, skip-when-loaded, branch availability, Secure Boot stop and the reboot decision. The H200 values are the
real ones (tests/unit/fixtures/gpu/h200-x1/nvml.txt: pciDeviceId 0x233510DE; /proc/driver/nvidia/version from the
borrowed H200 in tests/device/h200-real-run.log)."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import nvidia_driver_plan as plan

H200_PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
                     "GCC version:  gcc version 15.3.0 (GCC) \n")
PROPRIETARY_PROC_VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.247.01  Thu May  1 16:33:25 UTC 2025\n"
                            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def gpu(device_id, pci="0000:01:00.0"):
    return {"pci": pci, "device_id": device_id, "arch": plan.architecture_for_device_id(device_id)}


@pytest.mark.parametrize("device_id,arch", [
    ("0x2335", "hopper"),     # H200 (real, borrowed machine)
    ("0x2330", "hopper"),     # H100 SXM5
    ("0x2342", "hopper"),     # GH200
    ("0x2684", "ada"),        # RTX 4090
    ("0x26b9", "ada"),        # L40S
    ("0x2204", "ampere"),     # RTX 3090
    ("0x20b0", "ampere"),     # A100 SXM4
    ("0x2b85", "blackwell"),  # RTX 5090
    ("0x2901", "blackwell"),  # B200
    ("0x1e04", "turing"),     # RTX 2080 Ti
    ("0x2182", "turing"),     # GTX 1660 Ti (TU116)
    ("0x1db1", "volta"),      # V100 SXM2
    ("0x1d81", "volta"),      # TITAN V
    ("0x15f8", "pascal"),     # P100
    ("0x1b06", "pascal"),     # GTX 1080 Ti
    ("0x13c2", "maxwell"),    # GTX 970
    ("0x1023", "kepler"),     # K40
    ("0x0000", None),
    ("garbage", None),
    (0x2335, "hopper"),
])
def test_architecture_for_device_id(device_id, arch):
    assert plan.architecture_for_device_id(device_id) == arch


def test_parse_loaded_version_open_and_proprietary():
    assert plan.parse_loaded_version(H200_PROC_VERSION) == ("580.159.04", "open")
    assert plan.parse_loaded_version(PROPRIETARY_PROC_VERSION) == ("535.247.01", "proprietary")
    assert plan.parse_loaded_version("") == (None, None)
    assert plan.parse_loaded_version(None) == (None, None)
    assert plan.parse_loaded_version("something else") == (None, None)


@pytest.mark.parametrize("package_version,upstream", [
    ("580.105.08-1", "580.105.08"),
    ("1:580.95.05-1~deb12u1", "580.95.05"),
    ("580.95.05-0ubuntu0.24.04.2", "580.95.05"),
    ("535.247.01", "535.247.01"),
    ("", None),
    (None, None),
])
def test_upstream_version(package_version, upstream):
    assert plan.upstream_version(package_version) == upstream


def test_validate_request():
    assert plan.validate_request("580", "", "auto") == []
    assert plan.validate_request("580", "580.95.05", "open") == []
    assert "three-digit branch" in plan.validate_request("latest", "", "auto")[0]
    assert "not on branch 580" in plan.validate_request("580", "575.64.03", "auto")[0]
    assert 'nvidia_driver_branch: "575"' in plan.validate_request("580", "575.64.03", "auto")[0]
    assert "not a driver version" in plan.validate_request("580", "580", "auto")[0]
    assert "auto, open or proprietary" in plan.validate_request("580", "", "closed")[0]


def test_module_type_auto():
    chosen, reasons, errors = plan.resolve_kernel_module_type("auto", [gpu("0x2335")], "580")
    assert (chosen, errors) == ("open", [])
    assert "recommended from Turing on" in reasons[0]
    assert plan.resolve_kernel_module_type("auto", [gpu("0x2b85")], "580")[0] == "open"
    chosen, reasons, errors = plan.resolve_kernel_module_type("auto", [gpu("0x1db1")], "580")
    assert chosen == "proprietary" and "older than Turing" in reasons[0]
    chosen, reasons, errors = plan.resolve_kernel_module_type("auto", [], "580")
    assert chosen == "open" and "no GPU found" in reasons[0]
    # Branches before 515 have no open module.
    assert plan.resolve_kernel_module_type("auto", [gpu("0x2204")], "470")[0] == "proprietary"


def test_module_type_refusals_say_what_to_set():
    chosen, reasons, errors = plan.resolve_kernel_module_type("proprietary", [gpu("0x2b85")], "580")
    assert chosen is None
    assert "Blackwell" in errors[0] and "nvidia_driver_kernel_module_type: open" in errors[0]
    chosen, reasons, errors = plan.resolve_kernel_module_type("open", [gpu("0x1b06")], "580")
    assert chosen is None and "nvidia_driver_kernel_module_type: proprietary" in errors[0]
    chosen, reasons, errors = plan.resolve_kernel_module_type(
        "auto", [gpu("0x1b06", "0000:01:00.0"), gpu("0x2b85", "0000:02:00.0")], "580")
    assert chosen is None and "mixes" in errors[0]
    chosen, reasons, errors = plan.resolve_kernel_module_type("open", [gpu("0x2204")], "470")
    assert chosen is None and "no open kernel module" in errors[0]
    # Unknown ids are assumed open-capable and said so.
    chosen, reasons, errors = plan.resolve_kernel_module_type("proprietary", [gpu("0x0001")], "580")
    assert chosen == "proprietary" and "unknown PCI device id" in reasons[0]


def test_branch_for_gpus():
    assert plan.check_branch_for_gpus("580", [gpu("0x2335"), gpu("0x2b85")]) == []
    errors = plan.check_branch_for_gpus("550", [gpu("0x2b85")])
    assert "set nvidia_driver_branch to 570 or newer" in errors[0]
    errors = plan.check_branch_for_gpus("590", [gpu("0x1db1")])
    assert "dropped the Volta" in errors[0] and 'nvidia_driver_branch: "580"' in errors[0]
    errors = plan.check_branch_for_gpus("515", [gpu("0x2684")])
    assert "Ada" in errors[0]
    assert plan.check_branch_for_gpus("not-a-number", [gpu("0x2684")]) == []


def test_choose_source():
    assert plan.choose_source("auto", "Debian", "Ubuntu") == ("distribution", None)
    assert plan.choose_source("cuda", "Debian", "Ubuntu") == ("cuda", None)
    assert plan.choose_source("auto", "Debian", "Debian") == ("distribution", None)
    assert plan.choose_source("auto", "RedHat", "Rocky") == ("cuda", None)
    source, error = plan.choose_source("distribution", "RedHat", "RedHat")
    assert source is None and "nvidia_driver_source: cuda" in error
    source, error = plan.choose_source("auto", "Suse", "SLES")
    assert source is None and "SLES" in error


def test_package_plan_ubuntu_canonical_signed():
    p = plan.package_plan("Debian", "Ubuntu", "24", "distribution", "580", "", "open", kernel_release="6.8.0-45-generic")
    assert p["manager"] == "apt" and p["signed_modules"] is True and p["repository"] == "ubuntu"
    assert p["install"] == ["nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server",
                            "linux-modules-nvidia-580-server-open-generic"]
    assert "linux-generic" in p["hold"] and p["pin_version"] == "580.*"
    p = plan.package_plan("Debian", "Ubuntu", "22", "distribution", "580", "580.95.05", "proprietary")
    assert p["install"][0] == "nvidia-headless-no-dkms-580-server=580.95.05-*"
    assert p["install"][2] == "linux-modules-nvidia-580-server-generic"
    assert p["pin_version"] == "580.95.05-*"


def test_package_plan_ubuntu_cuda_repo():
    p = plan.package_plan("Debian", "Ubuntu", "24", "cuda", "580", "", "open", kernel_release="6.8.0-45-generic")
    assert p["repository"] == "cuda" and p["signed_modules"] is False
    assert p["install"] == ["linux-headers-6.8.0-45-generic", "nvidia-open-580"]
    assert p["fabricmanager"] == "nvidia-fabricmanager"
    p = plan.package_plan("Debian", "Ubuntu", "24", "cuda", "570", "", "proprietary", kernel_headers=False)
    assert p["install"] == ["cuda-drivers-570"] and p["fabricmanager"] == "nvidia-fabricmanager-570"


def test_package_plan_debian_non_free_and_cuda():
    # Debian's archive names the open module nvidia-open-kernel-dkms (contrib); NVIDIA's repository
    # nvidia-kernel-open-dkms. The headers of the kernel built for, and its flavour's meta package.
    p = plan.package_plan("Debian", "Debian", "12", "distribution", "535", "", "open", kernel_release="6.1.0-28-amd64")
    assert p["repository"] == "debian-non-free"
    assert p["install"] == ["linux-headers-6.1.0-28-amd64", "linux-headers-amd64", "nvidia-driver",
                            "nvidia-open-kernel-dkms", "nvidia-persistenced", "libcuda1", "nvidia-smi",
                            "firmware-nvidia-gsp"]
    assert p["candidate_packages"] == ["nvidia-driver", "nvidia-open-kernel-dkms"]
    assert {"nvidia-open-kernel-dkms", "nvidia-open-kernel-support", "linux-image-amd64",
            "linux-headers-amd64"} <= set(p["hold"])
    assert p["fabricmanager"] is None  # Debian does not ship it
    # Debian 13 (what `make test-driver` installs): 550, the cloud flavour's meta packages.
    p = plan.package_plan("Debian", "Debian", "13", "distribution", "550", "", "open",
                          kernel_release="6.12.57+deb13-cloud-amd64")
    assert p["install"][:4] == ["linux-headers-6.12.57+deb13-cloud-amd64", "linux-headers-cloud-amd64",
                                "nvidia-driver", "nvidia-open-kernel-dkms"]
    assert {"linux-image-cloud-amd64", "linux-headers-cloud-amd64"} <= set(p["hold"])
    p = plan.package_plan("Debian", "Debian", "13", "distribution", "550", "", "proprietary",
                          kernel_release="6.12.57+deb13-amd64", kernel_headers=False)
    assert p["install"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-persistenced", "libcuda1", "nvidia-smi",
                            "firmware-nvidia-gsp"]
    assert "nvidia-kernel-support" in p["hold"] and "linux-image-amd64" in p["hold"]
    p = plan.package_plan("Debian", "Debian", "13", "distribution", "550", "550.163.01", "open", kernel_headers=False)
    assert p["install"] == ["nvidia-driver=550.163.01-*", "nvidia-open-kernel-dkms=550.163.01-*", "nvidia-persistenced",
                            "libcuda1=550.163.01-*", "nvidia-smi=550.163.01-*", "firmware-nvidia-gsp"]
    p = plan.package_plan("Debian", "Debian", "12", "cuda", "580", "", "open", kernel_release="6.1.0-28-amd64")
    assert "nvidia-kernel-open-dkms" in p["install"] and "nvidia-kernel-support" in p["install"]
    p = plan.package_plan("Debian", "Debian", "12", "cuda", "580", "580.105.08", "proprietary")
    assert p["repository"] == "cuda" and "nvidia-kernel-dkms=580.105.08-*" in p["install"]
    assert p["fabricmanager"] == "nvidia-fabricmanager"
    assert "nvidia-*" in p["pin_packages"]


def test_package_plan_rhel_module_streams():
    p = plan.package_plan("RedHat", "Rocky", "9", "cuda", "580", "", "open", kernel_release="5.14.0-503.el9.x86_64")
    assert p["manager"] == "dnf" and p["module_stream"] == "nvidia-driver:580-open"
    assert p["install"][0] == "@nvidia-driver:580-open"
    assert "kernel-devel-5.14.0-503.el9.x86_64" in p["install"]
    assert "kmod-nvidia-open-dkms" in p["hold"] and p["fabricmanager"] == "nvidia-fabric-manager"
    p = plan.package_plan("RedHat", "RedHat", "9", "cuda", "570", "570.172.08", "proprietary", kernel_headers=False)
    assert p["module_stream"] == "nvidia-driver:570-dkms" and "nvidia-driver-570.172.08" in p["install"]


@pytest.mark.parametrize("release, flavour", [
    ("6.12.57+deb13-amd64", "amd64"), ("6.12.57+deb13-cloud-amd64", "cloud-amd64"), ("6.12.57+deb13-rt-amd64", "rt-amd64"),
    ("6.12.57+deb13-arm64", "arm64"), ("6.1.0-28-amd64", "amd64"), ("6.12.9+bpo-amd64", "amd64"),
    ("6.18.44-fc-v1252", None), ("", None), (None, None)])
def test_debian_kernel_flavour(release, flavour):
    assert plan.debian_kernel_flavour(release) == flavour


def test_package_plan_debian_kernel_not_debians():
    # A kernel Debian did not build (the lab container's host kernel): its headers only, the amd64 metas held.
    p = plan.package_plan("Debian", "Debian", "13", "distribution", "550", "", "open", kernel_release="6.18.44-fc-v1252")
    assert p["install"][:2] == ["linux-headers-6.18.44-fc-v1252", "nvidia-driver"]
    assert "linux-image-amd64" in p["hold"]


# The first line is what dkms 3.2.2 printed on Debian 13 after nvidia-kernel-dkms 550.163.01-2 (`make test-driver`,
# docs/measurements.md); then a module only added, one built but not installed, and dkms 2's comma form.
DKMS_STATUS = (
    "nvidia-current/550.163.01, 6.12.118+deb13-amd64, x86_64: installed\n"
    "zfs/2.3.2: added\n"
    "nvidia-current-open/550.163.01, 6.12.48+deb13-amd64, x86_64: built\n"
    "nvidia, 535.247.01, 6.1.0-28-amd64, x86_64: installed (original_module exists)\n"
)


def test_parse_dkms_status():
    entries = plan.parse_dkms_status(DKMS_STATUS)
    assert entries[0] == {"module": "nvidia-current", "version": "550.163.01", "kernel": "6.12.118+deb13-amd64",
                          "arch": "x86_64", "state": "installed"}
    assert [e["state"] for e in entries] == ["installed", "built", "installed (original_module exists)"]
    assert entries[2]["module"] == "nvidia" and entries[2]["version"] == "535.247.01"
    assert plan.parse_dkms_status("") == [] and plan.parse_dkms_status(None) == []


def test_dkms_built():
    entries = plan.parse_dkms_status(DKMS_STATUS)
    assert plan.dkms_built(entries, "550.163.01", "6.12.118+deb13-amd64") is True
    assert plan.dkms_built(entries, "550.163.01", "6.12.48+deb13-amd64") is False  # built, not installed
    assert plan.dkms_built(entries, "550.163.02", "6.12.118+deb13-amd64") is False  # another driver version
    assert plan.dkms_built(entries, "535.247.01", "6.1.0-28-amd64") is True
    assert plan.dkms_built([], "550.163.01", "6.12.118+deb13-amd64") is False


def test_branch_available():
    offered = ["590.44.01-1", "580.105.08-1", "580.95.05-1"]
    assert plan.branch_available(offered, "580") == (True, ["580", "590"])
    assert plan.branch_available(offered, "999") == (False, ["580", "590"])
    assert plan.branch_available(offered, "580", "580.95.05")[0] is True
    assert plan.branch_available(offered, "580", "580.65.06")[0] is False
    assert plan.branch_available([], "580") == (False, [])


def test_secure_boot_stop():
    errors = plan.secure_boot_errors(True, False, False, "install")
    assert "mokutil --import /var/lib/dkms/mok.pub" in errors[0] and "nvidia_driver_source: distribution" in errors[0]
    assert plan.secure_boot_errors(True, True, False, "install") == []   # Canonical's signed modules
    assert plan.secure_boot_errors(True, False, True, "install") == []   # MOK enrolled
    assert plan.secure_boot_errors(True, False, False, "skip") == []     # nothing to install
    assert plan.secure_boot_errors(None, False, False, "install") == []  # unknown: not a stop
    assert plan.secure_boot_errors(False, False, False, "install") == []


def test_decide_action():
    # The H200: preinstalled read-only 580.159.04, branch 580 wanted.
    action, reason = plan.decide_action("580.159.04", "open", "580", "", None, False)
    assert action == "skip" and "already loaded" in reason
    assert plan.decide_action("580.159.04", "open", "580", "580.159.04", None, False)[0] == "skip"
    assert plan.decide_action("580.159.04", "open", "580", "580.105.08", None, False)[0] == "install"
    assert plan.decide_action("570.172.08", "open", "580", "", None, False)[0] == "install"
    assert plan.decide_action("570.172.08", "open", "580", "", None, True)[0] == "skip"  # accept_loaded
    action, reason = plan.decide_action("580.159.04", "proprietary", "580", "", "open", False)
    assert action == "install" and "proprietary kernel module" in reason
    assert plan.decide_action(None, None, "580", "", None, True) == ("install", "no NVIDIA driver is loaded")
    assert plan.decide_action("580.159.04", "open", "580", "", None, False, nvidia_smi_ok=False)[0] == "install"


def test_reboot_decision():
    # Lab: installed, not loaded, container connection -> needed but never taken.
    r = plan.reboot_decision("580.105.08", None, False, True, "community.docker.docker", False)
    assert r["needed"] and not r["reboot"] and "container connection" in r["blocked_by"][0]
    # Real host over SSH, allowed.
    r = plan.reboot_decision("580.105.08", "570.172.08", False, True, "ssh", False)
    assert r["reboot"] is True and "driver/library" in r["reasons"][0]
    # Not allowed.
    r = plan.reboot_decision("580.105.08", None, False, False, "ssh", False)
    assert r["needed"] and not r["reboot"] and r["blocked_by"] == ["nvidia_driver_reboot is false"]
    # Never the control node, never connection: local.
    assert not plan.reboot_decision("580.105.08", None, False, True, "ssh", True)["reboot"]
    r = plan.reboot_decision("580.105.08", None, False, True, "local", False)
    assert not r["reboot"] and "local" in r["blocked_by"][0]
    # Nothing to do: H200 (driver not from a package, loaded), or installed == loaded.
    assert plan.reboot_decision(None, "580.159.04", False, True, "local", True) == {
        "needed": False, "reboot": False, "reasons": [], "blocked_by": []}
    assert not plan.reboot_decision("580.105.08", "580.105.08", False, True, "ssh", False)["needed"]
    # nouveau still loaded after an install.
    r = plan.reboot_decision("580.105.08", "580.105.08", True, True, "ssh", False)
    assert r["reboot"] and "nouveau" in r["reasons"][0]


def test_cuda_fabricmanager_package():
    assert plan.cuda_fabricmanager_package("580") == "nvidia-fabricmanager"
    assert plan.cuda_fabricmanager_package("570") == "nvidia-fabricmanager-570"
    assert plan.cuda_fabricmanager_package(None) == "nvidia-fabricmanager"
