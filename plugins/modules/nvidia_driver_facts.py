#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_facts
short_description: Detect the NVIDIA driver state of a host and decide what the nvidia_driver role does
version_added: 0.1.0
description:
  - Read-only. Reads the loaded driver (C(/proc/driver/nvidia/version)), the NVIDIA GPUs and NVSwitches on the PCI
    bus (sysfs), whether nouveau is loaded, Secure Boot (EFI variables, then C(mokutil)), whether a DKMS Machine
    Owner Key is enrolled, the installed driver package's version, what DKMS built for the kernel and, when asked,
    the driver versions the configured repositories offer.
  - Decides, through the pure functions of C(plugins/module_utils/nvidia_driver_plan.py), the kernel module
    flavour (open or proprietary, by GPU architecture), the packages to install, hold and pin for the distribution,
    whether to skip because the wanted driver is already loaded, and whether a reboot is needed and allowed.
  - Problems with the request (a branch the GPUs cannot use, C(proprietary) for a Blackwell GPU, Secure Boot with no
    signing path, a branch the repositories do not offer) are returned in RV(errors), each with the fix; the role
    stops on them before any package changes.
author:
  - onprem.vllm developers (@onprem)
options:
  branch:
    description: Driver branch wanted, for example C(580).
    type: str
    required: true
  version:
    description: Exact driver version wanted (for example C(580.95.05)); empty means the newest of O(branch).
    type: str
    default: ""
  kernel_module_type:
    description: Kernel module flavour; C(auto) chooses open from Turing on and proprietary for older GPUs.
    type: str
    choices: [auto, open, proprietary]
    default: auto
  source:
    description:
      - Package source. C(distribution) is Canonical's signed packages on Ubuntu and non-free on Debian;
        C(cuda) is NVIDIA's CUDA repository (the only source on RHEL). C(auto) is C(distribution) on Debian and
        Ubuntu, C(cuda) on RHEL.
    type: str
    choices: [auto, cuda, distribution]
    default: auto
  accept_loaded:
    description: Accept any loaded driver (a preinstalled, read-only driver) and plan nothing to install.
    type: bool
    default: false
  os_family:
    description: The host's C(ansible_facts['os_family']).
    type: str
    required: true
  distribution:
    description: The host's C(ansible_facts['distribution']).
    type: str
    required: true
  distribution_major_version:
    description: The host's C(ansible_facts['distribution_major_version']).
    type: str
    default: ""
  kernel_release:
    description:
      - The kernel release the module is built for (C(ansible_facts['kernel']), the running kernel, unless the role
        is told another), for the kernel header packages and the DKMS check.
    type: str
    default: ""
  kernel_headers:
    description: Install the running kernel's headers (DKMS install paths build the module against them).
    type: bool
    default: true
  ubuntu_kernel_flavour:
    description: Ubuntu kernel flavour of the prebuilt C(linux-modules-nvidia-*) meta package (C(generic), C(aws) ...).
    type: str
    default: generic
  fabricmanager:
    description: Install Fabric Manager. C(auto) installs it when NVSwitches are on the PCI bus.
    type: str
    choices: [auto, install, skip]
    default: auto
  secure_boot:
    description: Secure Boot state; C(auto) detects it. The other values exist for tests and for firmware the
      detection cannot read.
    type: str
    choices: [auto, enabled, disabled]
    default: auto
  reboot:
    description: Whether the role may reboot the host when the installed driver is not the loaded one.
    type: bool
    default: false
  connection:
    description: The connection plugin used for the host (C(ansible_connection)); C(local) and container
      connections are never rebooted.
    type: str
    default: ""
  controller_machine_id:
    description: The control node's C(/etc/machine-id); a host with the same id is the control node and is never
      rebooted.
    type: str
    default: ""
  query_repository:
    description: Ask the package manager which driver versions the configured repositories offer (RV(candidates)).
    type: bool
    default: false
  host_root:
    description: Root under which C(/proc), C(/sys) and C(/etc/machine-id) are read. Only tests need another value.
    type: path
    default: /
notes:
  - Check mode is supported; the module never changes anything.
attributes:
  check_mode:
    description: Runs in check mode and returns the same facts; the module never changes anything.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
"""

EXAMPLES = r"""
- name: Decide what the driver role does
  onprem.vllm.nvidia_driver_facts:
    branch: "580"
    os_family: "{{ ansible_facts['os_family'] }}"
    distribution: "{{ ansible_facts['distribution'] }}"
    kernel_release: "{{ ansible_facts['kernel'] }}"
    connection: "{{ ansible_connection | default('ssh') }}"
  register: driver

- name: Show the decision
  ansible.builtin.debug:
    msg: "{{ driver.driver_action }}: {{ driver.action_reason }}"
"""

RETURN = r"""
loaded_version:
  description: Version of the loaded kernel module, or null when none is loaded.
  returned: always
  type: str
  sample: 580.159.04
loaded_module_type:
  description: Flavour of the loaded module (open or proprietary), or null.
  returned: always
  type: str
  sample: open
installed_version:
  description: Driver version of the installed version package (null when the package manager has none).
  returned: always
  type: str
  sample: 580.95.05
gpus:
  description: NVIDIA GPUs on the PCI bus, with their PCI device id and architecture (null when unknown).
  returned: always
  type: list
  elements: dict
  sample: [{"pci": "0000:00:06.0", "device_id": "0x2335", "arch": "hopper"}]
gpu_count:
  description: Number of NVIDIA GPUs on the PCI bus.
  returned: always
  type: int
nvswitch_count:
  description: Number of NVSwitches (PCI bridges of NVIDIA's vendor id) plus nvswitch driver devices.
  returned: always
  type: int
nouveau_loaded:
  description: Whether the nouveau module is loaded.
  returned: always
  type: bool
secure_boot:
  description: True, false, or null when it cannot be read.
  returned: always
  type: bool
mok_enrolled:
  description: Whether the DKMS signing key /var/lib/dkms/mok.pub is enrolled.
  returned: always
  type: bool
source:
  description: The package source chosen.
  returned: always
  type: str
  sample: cuda
kernel_module_type:
  description: The kernel module flavour chosen (null when the request is refused).
  returned: always
  type: str
  sample: open
packages:
  description: The package plan (manager, install, version_package, hold, pin_version, fabricmanager, repository,
    signed_modules, candidate_packages, module_stream on RHEL).
  returned: always
  type: dict
fabricmanager:
  description: Whether Fabric Manager is to be installed.
  returned: always
  type: bool
driver_action:
  description: C(install) or C(skip) (named so because C(action) is taken by Ansible's own result key).
  returned: always
  type: str
action_reason:
  description: Why.
  returned: always
  type: str
reasons:
  description: The decisions made, one line each.
  returned: always
  type: list
  elements: str
candidates:
  description: Versions (apt) or module streams (dnf) the repositories offer; empty unless O(query_repository).
  returned: always
  type: list
  elements: str
branch_available:
  description: Whether the repositories offer the wanted branch/version (null unless O(query_repository)).
  returned: always
  type: bool
dkms:
  description:
    - What DKMS built for the kernel of O(kernel_release) (C(dkms status -k)), once the driver is installed by a DKMS
      path with O(kernel_headers). Keys C(kernel), C(modules) (module, version, kernel, arch, state) and C(built), true
      when a module of the installed driver's version is installed for that kernel. C(built) is null where this
      does not apply (nothing installed, signed prebuilt modules, no headers managed).
  returned: always
  type: dict
  sample:
    kernel: 6.12.118+deb13-amd64
    built: true
    modules:
      - {module: nvidia-current, version: 550.163.01, kernel: 6.12.118+deb13-amd64, arch: x86_64, state: installed}
reboot:
  description: The reboot decision (needed, reboot, reasons, blocked_by).
  returned: always
  type: dict
errors:
  description: Refusals, each saying what to change. The role stops on them before changing packages.
  returned: always
  type: list
  elements: str
plan_errors:
  description:
    - Refusals the plan check (roles/plan_check) adds before any host changes, which the driver role itself only
      reports; today nouveau loaded on a host that needs an install and may not reboot.
  returned: always
  type: list
  elements: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_pci
from ansible_collections.onprem.vllm.plugins.module_utils import nvidia_driver_plan as plan
from ansible_collections.onprem.vllm.plugins.module_utils.gpu_nvml import nvswitch_host_evidence

_SECURE_BOOT_VAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
_MOK_PUB = "/var/lib/dkms/mok.pub"


def _read(path, binary=False):
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def loaded_modules(host_root):
    text = _read(os.path.join(host_root, "proc/modules")) or ""
    return {line.split(" ", 1)[0] for line in text.splitlines() if line}


def secure_boot_state(module, host_root, override):
    if override != "auto":
        return override == "enabled"
    data = _read(os.path.join(host_root, _SECURE_BOOT_VAR), binary=True)
    if data and len(data) >= 5:
        return data[4] == 1
    if not os.path.isdir(os.path.join(host_root, "sys/firmware/efi")):
        return False  # legacy BIOS boot: no Secure Boot
    mokutil = module.get_bin_path("mokutil") if host_root == "/" else None
    if mokutil:
        rc, out, err = module.run_command([mokutil, "--sb-state"])
        text = (out + err).lower()
        if "secureboot enabled" in text:
            return True
        if "secureboot disabled" in text:
            return False
    return None


def mok_enrolled(module, host_root):
    if host_root != "/" or not os.path.exists(_MOK_PUB):
        return False
    mokutil = module.get_bin_path("mokutil")
    if not mokutil:
        return False
    rc, out, err = module.run_command([mokutil, "--test-key", _MOK_PUB])
    return "already enrolled" in (out + err)


def installed_version(module, manager, package, host_root):
    if host_root != "/" or not package:
        return None
    if manager == "apt":
        dpkg_query = module.get_bin_path("dpkg-query")
        if not dpkg_query:
            return None
        rc, out, err = module.run_command([dpkg_query, "-W", "-f=${db:Status-Abbrev}|${Version}", package],
                                          expand_user_and_vars=False)
        # Status-Abbrev: want flag (i install, h hold ...), then the current state; "i" there means installed.
        if rc == 0 and out[1:2] == "i" and "|" in out:
            return plan.upstream_version(out.split("|", 1)[1].strip())
        return None
    rpm = module.get_bin_path("rpm")
    if not rpm:
        return None
    rc, out, err = module.run_command([rpm, "-q", "--qf", "%{VERSION}", package])
    return out.strip() if rc == 0 and out.strip() else None


def dkms_state(module, params, packages, action, installed, host_root):
    """Which modules DKMS built for the kernel whose headers the role installs, once the driver is installed by a
    DKMS path (not Canonical's signed modules); built is None where that does not apply."""
    kernel = params["kernel_release"]
    state = {"kernel": kernel, "modules": [], "built": None}
    if (host_root != "/" or action != "install" or not installed or not params["kernel_headers"] or not kernel
            or not packages or packages.get("signed_modules")):
        return state
    dkms = module.get_bin_path("dkms")
    if dkms:
        rc, out, err = module.run_command([dkms, "status", "-k", kernel])
        state["modules"] = plan.parse_dkms_status(out)
    state["built"] = plan.dkms_built(state["modules"], installed, kernel)
    return state


def parse_madison(text):
    """`apt-cache madison PKG` -> the versions offered."""
    versions = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def parse_dnf_module_streams(text, name="nvidia-driver"):
    """`dnf module list nvidia-driver` -> the stream names ('580-open', '580-dkms', 'latest-dkms', ...)."""
    streams = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == name and fields[1] not in streams:
            streams.append(re.sub(r"\s*\[[a-z]\]$", "", fields[1]))
    return streams


def query_candidates(module, packages, branch, version):
    """Returns (candidates, available)."""
    if packages["manager"] == "apt":
        apt_cache = module.get_bin_path("apt-cache", required=True)
        versions = []
        for name in packages["candidate_packages"][:1]:
            rc, out, err = module.run_command([apt_cache, "madison", name])
            versions.extend(parse_madison(out))
        available, dummy = plan.branch_available(versions, branch, version)
        return versions, available
    dnf = module.get_bin_path("dnf", required=True)
    rc, out, err = module.run_command([dnf, "-q", "module", "list", "nvidia-driver"])
    streams = parse_dnf_module_streams(out)
    wanted = packages["module_stream"].split(":", 1)[1]
    return streams, wanted in streams


def main():
    module = AnsibleModule(
        argument_spec=dict(
            branch=dict(type="str", required=True),
            version=dict(type="str", default=""),
            kernel_module_type=dict(type="str", default="auto", choices=["auto", "open", "proprietary"]),
            source=dict(type="str", default="auto", choices=["auto", "cuda", "distribution"]),
            accept_loaded=dict(type="bool", default=False),
            os_family=dict(type="str", required=True),
            distribution=dict(type="str", required=True),
            distribution_major_version=dict(type="str", default=""),
            kernel_release=dict(type="str", default=""),
            kernel_headers=dict(type="bool", default=True),
            ubuntu_kernel_flavour=dict(type="str", default="generic"),
            fabricmanager=dict(type="str", default="auto", choices=["auto", "install", "skip"]),
            secure_boot=dict(type="str", default="auto", choices=["auto", "enabled", "disabled"]),
            reboot=dict(type="bool", default=False),
            connection=dict(type="str", default=""),
            controller_machine_id=dict(type="str", default=""),
            query_repository=dict(type="bool", default=False),
            host_root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    root = p["host_root"]
    branch, version = str(p["branch"]).strip(), (p["version"] or "").strip()
    request_errors = plan.validate_request(branch, version, p["kernel_module_type"])
    errors = list(request_errors)
    reasons = []

    loaded_version, loaded_type = plan.parse_loaded_version(_read(os.path.join(root, "proc/driver/nvidia/version")))
    modules = loaded_modules(root)
    devices = gpu_pci.read_pci_devices(os.path.join(root, "sys"))
    gpus = [{"pci": dev["address"], "device_id": dev["device"], "arch": plan.architecture_for_device_id(dev["device"])}
            for dev in gpu_pci.nvidia_gpus(devices)]
    switches = gpu_pci.nvswitch_count(devices)
    if not switches:
        evidence = nvswitch_host_evidence(root)
        if evidence:
            count = re.match(r"[0-9]+", evidence[0])
            switches = int(count.group(0)) if count else 1
    nouveau = "nouveau" in modules

    source, source_error = plan.choose_source(p["source"], p["os_family"], p["distribution"])
    if source_error:
        errors.append(source_error)
    module_type, type_reasons, type_errors = plan.resolve_kernel_module_type(p["kernel_module_type"], gpus, branch)
    reasons.extend(type_reasons)
    errors.extend(type_errors)
    errors.extend(plan.check_branch_for_gpus(branch, gpus))

    packages = {}
    if source and not errors:
        packages = plan.package_plan(p["os_family"], p["distribution"], p["distribution_major_version"], source,
                                     branch, version, module_type, kernel_release=p["kernel_release"],
                                     kernel_headers=p["kernel_headers"], ubuntu_kernel_flavour=p["ubuntu_kernel_flavour"])

    action, action_reason = plan.decide_action(loaded_version, loaded_type, branch, version,
                                               None if p["kernel_module_type"] == "auto" else module_type,
                                               p["accept_loaded"])
    reasons.append(action_reason)
    if action == "skip":
        # A satisfied host is left alone: the request is only checked against what would be installed.
        errors = list(request_errors)

    fabricmanager = p["fabricmanager"] == "install" or (p["fabricmanager"] == "auto" and switches > 0)
    if fabricmanager:
        reasons.append("Fabric Manager: %s" % ("%d NVSwitch(es) found" % switches if switches else "requested"))
        if action == "install" and packages and not packages.get("fabricmanager"):
            errors.append("NVSwitches need Fabric Manager, which Debian's non-free does not ship: set "
                          "nvidia_driver_source: cuda (NVIDIA's debian12 repository)")

    secure_boot = secure_boot_state(module, root, p["secure_boot"])
    enrolled = mok_enrolled(module, root) if secure_boot else False
    errors.extend(plan.secure_boot_errors(secure_boot, packages.get("signed_modules", False), enrolled, action))

    candidates, available = [], None
    if p["query_repository"] and packages and action == "install":
        candidates, available = query_candidates(module, packages, branch, version)
        if not available:
            offered = plan.branch_available(candidates, branch, version)[1] if packages["manager"] == "apt" else candidates
            errors.append("the configured %s repository does not offer %s for %s %s (offered: %s): choose one of "
                          "those for nvidia_driver_branch/nvidia_driver_version, or point the repository at one "
                          "that has it" % (packages["repository"], ("version " + version) if version else
                                           ("branch " + branch), p["distribution"], p["distribution_major_version"],
                                           ", ".join(offered) or "nothing"))

    installed = installed_version(module, packages.get("manager"), packages.get("version_package"), root)
    dkms = dkms_state(module, p, packages, action, installed, root)
    machine_id = (_read(os.path.join(root, "etc/machine-id")) or "").strip()
    is_controller = bool(machine_id) and machine_id == (p["controller_machine_id"] or "").strip()
    reboot = plan.reboot_decision(installed, loaded_version, nouveau, p["reboot"],
                                  p["connection"], is_controller, action)

    module.exit_json(
        changed=False, loaded_version=loaded_version, loaded_module_type=loaded_type, installed_version=installed,
        gpus=gpus, gpu_count=len(gpus), nvswitch_count=switches, nouveau_loaded=nouveau, secure_boot=secure_boot,
        mok_enrolled=enrolled, source=source, kernel_module_type=module_type, packages=packages,
        fabricmanager=fabricmanager, driver_action=action, action_reason=action_reason, reasons=reasons,
        candidates=candidates, branch_available=available, reboot=reboot, errors=errors, dkms=dkms,
        plan_errors=plan.plan_check_errors(nouveau, action, reboot),
    )


if __name__ == "__main__":
    main()
