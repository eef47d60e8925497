# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure decisions of the nvidia_driver role: which GPU architecture a PCI device id belongs to, which kernel module
flavour (open / proprietary) it needs, whether a driver branch fits the GPUs, which packages to install, hold and pin
on which distribution, whether the loaded driver already satisfies the request (skip), and whether a reboot is needed
and allowed. Nothing here touches the host: the module nvidia_driver_facts reads the host and calls these functions.

Sources for the tables (NVIDIA's public documents, as of the 580 branch):
- Open GPU kernel modules: supported from Turing on, the default from branch 560, required on Blackwell;
  Maxwell, Pascal and Volta have only the proprietary module (NVIDIA driver installation guide, "Kernel modules";
  github.com/NVIDIA/open-gpu-kernel-modules README). The open flavour exists from branch 515.
- Branch 580 is the last branch supporting Maxwell, Pascal and Volta; 470 is the last for Kepler
  (NVIDIA release notes, "GPU support").
- Minimum branches are the generation's first production branch: Ada/Hopper 525, Blackwell 570.
- PCI device-id ranges per architecture follow the driver README's supported-GPU appendix (device ids are grouped
  by chip; the ranges below are the chips' blocks, specific blocks listed before the broad ones that contain them).
"""

from __future__ import annotations

import re

ARCH_ORDER = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")

# (first id, last id, architecture): the first matching row wins, so narrower blocks come first.
_DEVICE_ID_RANGES = (
    (0x15F0, 0x15FF, "pascal"),     # GP100
    (0x1D81, 0x1D81, "volta"),      # TITAN V
    (0x1DB0, 0x1DBF, "volta"),      # GV100
    (0x20B0, 0x20BF, "ampere"),     # GA100 (A100)
    (0x20F0, 0x20FF, "ampere"),     # GA100 (A800 / A100X)
    (0x2300, 0x23FF, "hopper"),     # GH100 (H100 = 0x2330/0x2331, H200 = 0x2335, GH200 = 0x2342); inside GA10x's block
    (0x0FC0, 0x12FF, "kepler"),     # GK10x / GK110 / GK208
    (0x1340, 0x17FF, "maxwell"),    # GM107 / GM108 / GM200 / GM204 / GM206
    (0x1B00, 0x1DFF, "pascal"),     # GP102 .. GP108
    (0x1E00, 0x1FFF, "turing"),     # TU102 / TU104 / TU106 / TU117
    (0x2180, 0x21FF, "turing"),     # TU116
    (0x2200, 0x25FF, "ampere"),     # GA102 .. GA107
    (0x2600, 0x28FF, "ada"),        # AD102 .. AD107 (RTX 4090 = 0x2684, L40S = 0x26B9)
    (0x2900, 0x2FFF, "blackwell"),  # GB100 / GB102 / GB202 .. GB207 (B200 = 0x2901, RTX 5090 = 0x2B85)
    (0x3000, 0x3FFF, "blackwell"),  # GB110 and later blocks: newer than Blackwell is treated as open-only too
)

OPEN_SUPPORTED_FROM = "turing"
OPEN_REQUIRED_FROM = "blackwell"
OPEN_FIRST_BRANCH = 515
OPEN_DEFAULT_BRANCH = 560
MIN_BRANCH = {"turing": 418, "ampere": 450, "ada": 525, "hopper": 525, "blackwell": 570}
MAX_BRANCH = {"kepler": 470, "maxwell": 580, "pascal": 580, "volta": 580}

_BRANCH_RE = re.compile(r"^[1-9][0-9]{2}$")
_VERSION_RE = re.compile(r"^([1-9][0-9]{2})\.[0-9]+(\.[0-9]+)?$")
_LOADED_RE = re.compile(r"NVRM version:.*?\s([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)\s")
# Debian's kernel releases: ABI, then the flavour its meta packages are named after (linux-headers-FLAVOUR):
# 6.12.48+deb13-amd64, 6.12.48+deb13-cloud-amd64 (Debian 13), 6.1.0-28-amd64 (Debian 12), 6.12.9+bpo-amd64 (backports).
_DEBIAN_KERNEL_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:\+deb[0-9]+|\+bpo|-[0-9]+)-([a-z0-9]+(?:-[a-z0-9]+)*)$")

# Connections under which the role never reboots: the play would reboot the machine Ansible runs on, or a container
# (the lab), whose "reboot" is not a kernel reload at all.
LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")
CONTAINER_CONNECTIONS = (
    "docker", "community.docker.docker", "community.docker.docker_api", "community.docker.nsenter",
    "podman", "containers.podman.podman", "buildah", "containers.podman.buildah",
    "lxd", "community.general.lxd", "lxc", "community.general.lxc", "chroot", "community.general.chroot",
    "kubectl", "kubernetes.core.kubectl",
)

# apt preferences globs for the driver's user-space and kernel packages (all carry the driver's version, so a
# "Pin: version BRANCH.*" holds them on the branch; packages with other version schemes, such as
# nvidia-container-toolkit 1.x, are not matched by that version and keep their normal priority).
APT_PIN_GLOBS = (
    "nvidia-*", "libnvidia-*", "libcuda*", "libnvcuvid*", "libnvoptix*", "libxnvctrl*", "firmware-nvidia-*",
    "xserver-xorg-video-nvidia*", "cuda-drivers*",
)


def architecture_for_device_id(device_id):
    """PCI device id (int or '0x2335') -> architecture name, or None for an id outside the known blocks."""
    if isinstance(device_id, str):
        try:
            device_id = int(device_id, 16)
        except ValueError:
            return None
    for first, last, arch in _DEVICE_ID_RANGES:
        if first <= device_id <= last:
            return arch
    return None


def _arch_index(arch):
    return ARCH_ORDER.index(arch) if arch in ARCH_ORDER else None


def parse_loaded_version(text):
    """Content of /proc/driver/nvidia/version -> (version, module_type) or (None, None).

    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...' -> ('580.159.04', 'open')
    'NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.247.01  ...'                     -> ('535.247.01', 'proprietary')
    """
    if not text:
        return None, None
    match = _LOADED_RE.search(text + " ")
    if not match:
        return None, None
    flavour = "open" if "Open Kernel Module" in text else "proprietary"
    return match.group(1), flavour


def upstream_version(package_version):
    """A distribution package version -> the driver version: '1:580.95.05-1~deb12u1' -> '580.95.05'."""
    if not package_version:
        return None
    version = package_version.split(":", 1)[-1]
    version = version.split("-", 1)[0]
    version = version.split("+", 1)[0]
    return version or None


def debian_kernel_flavour(kernel_release):
    """'6.12.48+deb13-amd64' -> 'amd64', '6.1.0-28-cloud-amd64' -> 'cloud-amd64'; None for a kernel Debian did not
    build (no meta package follows it)."""
    match = _DEBIAN_KERNEL_RE.match(kernel_release or "")
    return match.group(1) if match else None


def branch_of(version):
    return version.split(".", 1)[0] if version else None


def version_matches(loaded_version, branch, version=""):
    """Whether a driver version satisfies the request (exact version when given, else the branch)."""
    if not loaded_version:
        return False
    if version:
        return loaded_version == version
    return branch_of(loaded_version) == str(branch)


def validate_request(branch, version, kernel_module_type):
    """Input errors that need no host facts. Returns a list of messages that say what to change."""
    errors = []
    branch = str(branch)
    if not _BRANCH_RE.match(branch):
        errors.append("nvidia_driver_branch=%r is not a driver branch: use the three-digit branch number, for "
                      "example \"580\"" % branch)
    if version:
        match = _VERSION_RE.match(str(version))
        if not match:
            errors.append("nvidia_driver_version=%r is not a driver version such as \"580.95.05\"" % version)
        elif match.group(1) != branch:
            errors.append("nvidia_driver_version %s is not on branch %s: set nvidia_driver_branch: \"%s\" or pick a "
                          "%s.x version" % (version, branch, match.group(1), branch))
    if kernel_module_type not in ("auto", "open", "proprietary"):
        errors.append("nvidia_driver_kernel_module_type must be auto, open or proprietary (got %r)" % kernel_module_type)
    return errors


def resolve_kernel_module_type(requested, gpus, branch):
    """Choose open or proprietary for the GPUs found. gpus: [{'pci': .., 'device_id': .., 'arch': ..}].

    Returns (module_type or None, reasons, errors)."""
    reasons, errors = [], []
    try:
        branch_num = int(branch)
    except (TypeError, ValueError):
        branch_num = 0
    turing = _arch_index(OPEN_SUPPORTED_FROM)
    blackwell = _arch_index(OPEN_REQUIRED_FROM)
    legacy = sorted({g["pci"] for g in gpus if g.get("arch") and _arch_index(g["arch"]) < turing})
    needs_open = sorted({g["pci"] for g in gpus if g.get("arch") and _arch_index(g["arch"]) >= blackwell})
    unknown = sorted({g["pci"] for g in gpus if not g.get("arch")})
    if unknown:
        reasons.append("GPU(s) with unknown PCI device id at %s: assumed to support the open module" % ", ".join(unknown))

    if requested == "proprietary" and needs_open:
        errors.append("GPU(s) at %s are Blackwell or newer and work only with the open kernel module: set "
                      "nvidia_driver_kernel_module_type: open (or auto)" % ", ".join(needs_open))
    if requested == "open" and legacy:
        errors.append("GPU(s) at %s are older than Turing and have no open kernel module: set "
                      "nvidia_driver_kernel_module_type: proprietary (or auto)" % ", ".join(legacy))
    if requested == "auto" and legacy and needs_open:
        errors.append("this host mixes pre-Turing GPUs (%s) with Blackwell GPUs (%s); no single kernel module drives "
                      "both: remove one kind of GPU from the host" % (", ".join(legacy), ", ".join(needs_open)))
    if errors:
        return None, reasons, errors

    if requested == "auto":
        if legacy:
            chosen = "proprietary"
            reasons.append("proprietary kernel module: GPU(s) older than Turing (%s)" % ", ".join(legacy))
        elif branch_num and branch_num < OPEN_FIRST_BRANCH:
            chosen = "proprietary"
            reasons.append("proprietary kernel module: branch %s predates the open modules (%d)" % (branch, OPEN_FIRST_BRANCH))
        else:
            chosen = "open"
            reasons.append("open kernel module: %s" % (
                "required on Blackwell" if needs_open else
                "recommended from Turing on" if gpus else "no GPU found on the PCI bus; NVIDIA's default since %d"
                % OPEN_DEFAULT_BRANCH))
    else:
        chosen = requested
        reasons.append("%s kernel module as requested" % chosen)
    if chosen == "open" and branch_num and branch_num < OPEN_FIRST_BRANCH:
        errors.append("branch %s has no open kernel module (first: %d): raise nvidia_driver_branch or set "
                      "nvidia_driver_kernel_module_type: proprietary" % (branch, OPEN_FIRST_BRANCH))
        return None, reasons, errors
    return chosen, reasons, errors


def check_branch_for_gpus(branch, gpus):
    """Errors for GPUs the branch does not drive (too old a branch for new GPUs, too new for legacy ones)."""
    errors = []
    try:
        branch_num = int(branch)
    except (TypeError, ValueError):
        return errors
    by_arch = {}
    for gpu in gpus:
        if gpu.get("arch"):
            by_arch.setdefault(gpu["arch"], []).append(gpu["pci"])
    for arch, pcis in sorted(by_arch.items(), key=lambda item: _arch_index(item[0])):
        low, high = MIN_BRANCH.get(arch), MAX_BRANCH.get(arch)
        if low and branch_num < low:
            errors.append("branch %s does not support the %s GPU(s) at %s: set nvidia_driver_branch to %d or newer"
                          % (branch, arch.capitalize(), ", ".join(pcis), low))
        if high and branch_num > high:
            errors.append("branch %s dropped the %s GPU(s) at %s (last branch: %d): set nvidia_driver_branch: \"%d\""
                          % (branch, arch.capitalize(), ", ".join(pcis), high, high))
    return errors


def choose_source(requested, os_family, distribution):
    """auto -> the default package source for the distribution. Returns (source, error)."""
    dist = (distribution or "").lower()
    if os_family == "RedHat":
        if requested == "distribution":
            return None, "RHEL-family hosts install the driver from NVIDIA's CUDA repository only: set nvidia_driver_source: cuda"
        return "cuda", None
    if dist == "ubuntu":
        return ("distribution" if requested == "auto" else requested), None
    if dist == "debian":
        return ("distribution" if requested == "auto" else requested), None
    return None, ("nvidia_driver supports Ubuntu 22.04/24.04, Debian 12/13 and RHEL 9-family hosts, not %s (%s)"
                  % (distribution, os_family))


def cuda_fabricmanager_package(branch):
    """NVIDIA's apt repositories name Fabric Manager per branch up to 570 and without the branch from 575 on."""
    try:
        return "nvidia-fabricmanager" if int(branch) >= 575 else "nvidia-fabricmanager-%s" % branch
    except (TypeError, ValueError):
        return "nvidia-fabricmanager"


def _apt_exact(name, version):
    return "%s=%s-*" % (name, version) if version else name


def package_plan(os_family, distribution, distribution_major_version, source, branch, version, module_type,
                 kernel_release="", kernel_headers=True, ubuntu_kernel_flavour="generic"):
    """Which packages install, hold and pin the driver. Returns a dict:

    manager (apt|dnf), install (names, exact versions applied), version_package (whose installed version is the
    driver's), hold (names to hold / versionlock), pin_version (apt preferences 'Pin: version' value),
    fabricmanager (package name, without version), signed_modules (prebuilt modules signed by the distribution),
    repository (cuda|debian-non-free|ubuntu), candidate_packages (names whose repository versions prove the branch).
    """
    branch = str(branch)
    dist = (distribution or "").lower()
    suffix_open = "-open" if module_type == "open" else ""
    plan = {"signed_modules": False, "pin_version": "%s%s" % (version or branch, "-*" if version else ".*"),
            "pin_packages": list(APT_PIN_GLOBS)}
    headers = []
    if os_family == "RedHat":
        stream = "%s-%s" % (branch, "open" if module_type == "open" else "dkms")
        if kernel_headers and kernel_release:
            headers = ["kernel-devel-%s" % kernel_release, "kernel-headers-%s" % kernel_release]
        plan.update(
            manager="dnf", repository="cuda", module_stream="nvidia-driver:%s" % stream,
            install=["@nvidia-driver:%s" % stream] + headers + ["nvidia-persistenced"],
            version_package="nvidia-driver",
            hold=["nvidia-driver", "nvidia-driver-libs", "nvidia-driver-cuda", "nvidia-driver-cuda-libs",
                  "nvidia-kmod-common", "kmod-nvidia-open-dkms" if module_type == "open" else "kmod-nvidia-latest-dkms",
                  "nvidia-persistenced", "kernel", "kernel-core", "kernel-modules", "kernel-devel"],
            fabricmanager="nvidia-fabric-manager", candidate_packages=["nvidia-driver"],
        )
        if version:
            plan["install"] = plan["install"] + ["nvidia-driver-%s" % version]
        return plan

    if kernel_headers and kernel_release:
        headers = ["linux-headers-%s" % kernel_release]
    if dist == "ubuntu" and source == "distribution":
        # Canonical's -server packages: prebuilt kernel modules signed by Canonical (Secure Boot works as is).
        modules = "linux-modules-nvidia-%s-server%s-%s" % (branch, suffix_open, ubuntu_kernel_flavour)
        main = "nvidia-headless-no-dkms-%s-server%s" % (branch, suffix_open)
        utils = "nvidia-utils-%s-server" % branch
        plan.update(
            manager="apt", repository="ubuntu", signed_modules=True,
            install=[_apt_exact(main, version), _apt_exact(utils, version), modules],
            version_package=main,
            hold=[main, utils, modules, "linux-image-%s" % ubuntu_kernel_flavour,
                  "linux-headers-%s" % ubuntu_kernel_flavour, "linux-%s" % ubuntu_kernel_flavour],
            fabricmanager="nvidia-fabricmanager-%s" % branch, candidate_packages=[main, modules],
        )
        return plan
    if dist == "ubuntu":
        # NVIDIA's CUDA repository: DKMS-built modules (unsigned unless a MOK signs them).
        main = ("nvidia-open-%s" if module_type == "open" else "cuda-drivers-%s") % branch
        plan.update(
            manager="apt", repository="cuda",
            install=headers + [_apt_exact(main, version)],
            version_package=main,
            hold=[main, "nvidia-driver-%s%s" % (branch, suffix_open), "nvidia-dkms-%s%s" % (branch, suffix_open),
                  "nvidia-kernel-common-%s" % branch, "nvidia-utils-%s" % branch, "libnvidia-compute-%s" % branch,
                  "linux-image-%s" % ubuntu_kernel_flavour, "linux-headers-%s" % ubuntu_kernel_flavour,
                  "linux-%s" % ubuntu_kernel_flavour],
            fabricmanager=cuda_fabricmanager_package(branch), candidate_packages=[main],
        )
        return plan
    # Debian 12/13: Debian's own archive (distribution: non-free, contrib, non-free-firmware) or NVIDIA's CUDA
    # repository. They name the open module apart: Debian's nvidia-open-kernel-dkms (contrib), NVIDIA's
    # nvidia-kernel-open-dkms. Debian's GSP firmware (Turing on) is firmware-nvidia-gsp, at the driver's version.
    # Debian's nvidia-driver only recommends libcuda1 (the CUDA driver the container toolkit mounts into the servers)
    # and nvidia-smi (this role's and the preflight's check); the role installs without recommends, so names them.
    distribution = source == "distribution"
    if module_type == "open":
        kernel = "nvidia-open-kernel-dkms" if distribution else "nvidia-kernel-open-dkms"
    else:
        kernel = "nvidia-kernel-dkms"
    support = "nvidia-open-kernel-support" if distribution and module_type == "open" else "nvidia-kernel-support"
    # The flavour's meta package too, so that a kernel upgrade brings the headers DKMS builds the new kernel's module
    # with; amd64 where the release is not one of Debian's.
    flavour = debian_kernel_flavour(kernel_release)
    if headers and flavour:
        headers.append("linux-headers-%s" % flavour)
    flavour = flavour or "amd64"
    plan.update(
        manager="apt", repository="debian-non-free" if distribution else "cuda",
        install=headers + [_apt_exact("nvidia-driver", version), _apt_exact(kernel, version),
                           _apt_exact("nvidia-persistenced", "")]
        + ([_apt_exact("libcuda1", version), _apt_exact("nvidia-smi", version), "firmware-nvidia-gsp"]
           if distribution else ["nvidia-kernel-support"]),
        version_package="nvidia-driver",
        hold=["nvidia-driver", kernel, support, "nvidia-persistenced", "nvidia-smi",
              "libnvidia-ml1", "libcuda1", "nvidia-alternative", "firmware-nvidia-gsp",
              "linux-image-%s" % flavour, "linux-headers-%s" % flavour],
        # Debian does not ship Fabric Manager: only NVIDIA's repository has it (the role stops with that fix).
        fabricmanager=cuda_fabricmanager_package(branch) if source == "cuda" else None,
        candidate_packages=["nvidia-driver", kernel],
    )
    return plan


def branch_available(candidate_versions, branch, version=""):
    """candidate_versions: versions the repositories offer for the main package (apt-cache madison / dnf).

    Returns (ok, offered_branches)."""
    offered = sorted({branch_of(upstream_version(v)) for v in candidate_versions if upstream_version(v)})
    wanted = [upstream_version(v) for v in candidate_versions]
    if version:
        return version in wanted, offered
    return str(branch) in offered, offered


def parse_dkms_status(text):
    """`dkms status` -> [{'module', 'version', 'kernel', 'arch', 'state'}], one per module built for a kernel.

    dkms 3: 'nvidia-current-open/550.163.01, 6.12.57+deb13-amd64, x86_64: installed'; dkms 2: 'nvidia, 535.247.01,
    6.1.0-28-amd64, x86_64: installed'. A module only added (no kernel) prints no kernel and is left out."""
    entries = []
    for line in (text or "").splitlines():
        head, sep, state = line.partition(": ")
        if not sep:
            continue
        fields = [field.strip() for field in head.split(",")]
        if "/" in fields[0]:
            fields = fields[0].split("/", 1) + fields[1:]
        if len(fields) < 3:
            continue
        entries.append({"module": fields[0], "version": fields[1], "kernel": fields[2],
                        "arch": fields[3] if len(fields) > 3 else "", "state": state.strip()})
    return entries


def dkms_built(entries, version, kernel_release):
    """Whether DKMS installed a module of the driver's version for the kernel: state 'installed', with or without
    dkms's note in parentheses ('installed (original_module exists)')."""
    return any(entry["version"] == version and entry["kernel"] == kernel_release
               and entry["state"].split(" ", 1)[0] == "installed" for entry in entries)


def secure_boot_errors(secure_boot, signed_modules, mok_enrolled, action):
    """Secure Boot without a signing path stops the role before any package changes."""
    if action != "install" or secure_boot is not True or signed_modules or mok_enrolled:
        return []
    return ["Secure Boot is enabled and this install path builds unsigned kernel modules (DKMS), which the kernel "
            "would refuse to load. Either (Ubuntu) set nvidia_driver_source: distribution to use Canonical's signed "
            "linux-modules-nvidia-* packages; or enroll a Machine Owner Key for DKMS: create it with "
            "`dkms generate_mok` (or `update-secureboot-policy --new-key` on Ubuntu), run "
            "`mokutil --import /var/lib/dkms/mok.pub`, reboot and confirm the key in MokManager, then re-run; "
            "or disable Secure Boot in the firmware."]


def decide_action(loaded_version, loaded_type, branch, version, module_type, accept_loaded, nvidia_smi_ok=None):
    """skip | install, with the reason. A loaded driver that matches the request (or any loaded driver when
    accept_loaded is set, for hosts whose driver is preinstalled and read-only) means nothing to install."""
    if loaded_version and accept_loaded:
        return "skip", "driver %s is loaded and nvidia_driver_accept_loaded is true: leaving the host's driver alone" % loaded_version
    if loaded_version and version_matches(loaded_version, branch, version):
        if module_type and loaded_type and module_type != loaded_type:
            return "install", ("driver %s is loaded but with the %s kernel module; %s was asked for"
                               % (loaded_version, loaded_type, module_type))
        if nvidia_smi_ok is False:
            return "install", "driver %s is loaded but nvidia-smi fails (driver/library mismatch?)" % loaded_version
        return "skip", "driver %s is already loaded (wanted %s): nothing to install" % (
            loaded_version, ("version " + version) if version else ("branch " + str(branch)))
    if loaded_version:
        return "install", "driver %s is loaded but %s is wanted" % (
            loaded_version, ("version " + version) if version else ("branch " + str(branch)))
    return "install", "no NVIDIA driver is loaded"


def reboot_decision(installed_version, loaded_version, nouveau_loaded, reboot_allowed, connection, is_controller,
                    action="install"):
    """Whether the host must reboot to run the installed driver, and whether the role may do it.

    Returns dict(needed, reboot, reasons, blocked_by): reboot is True only when needed and allowed."""
    reasons = []
    if installed_version and loaded_version and installed_version != loaded_version:
        reasons.append("installed driver %s differs from the loaded %s (NVML would report a driver/library "
                       "mismatch until reboot)" % (installed_version, loaded_version))
    elif installed_version and not loaded_version:
        reasons.append("driver %s is installed but not loaded" % installed_version)
    if nouveau_loaded and action == "install":
        reasons.append("nouveau is loaded and now blacklisted")
    needed = bool(reasons)
    blocked = []
    if needed:
        conn = (connection or "").strip()
        if conn in LOCAL_CONNECTIONS:
            blocked.append("never reboots a connection: local host (%s)" % conn)
        elif conn in CONTAINER_CONNECTIONS:
            blocked.append("never reboots through a container connection (%s): a lab host" % conn)
        if is_controller:
            blocked.append("never reboots the control node")
        if not reboot_allowed:
            blocked.append("nvidia_driver_reboot is false")
    return {"needed": needed, "reboot": needed and not blocked, "reasons": reasons, "blocked_by": blocked}


def plan_check_errors(nouveau_loaded, action, reboot):
    """Refusals for the plan check (before any change) that the role itself only reports: an install onto a host
    where nouveau holds the GPUs needs a reboot before the NVIDIA driver can load; if this run may not reboot, the
    GPU preflight after provisioning would fail on every such host, so the plan check stops first."""
    if not nouveau_loaded or action != "install" or not reboot.get("needed") or reboot.get("reboot"):
        return []
    return ["nouveau is loaded and holds the GPUs, so the NVIDIA driver installed by this run cannot load before a "
            "reboot, and this run may not reboot (%s). Either allow it (nvidia_driver_reboot: true, over SSH), or "
            "blacklist nouveau and reboot the host yourself first (echo 'blacklist nouveau' > "
            "/etc/modprobe.d/blacklist-nouveau.conf; update-initramfs -u; reboot), then re-run"
            % "; ".join(reboot.get("blocked_by") or ["reboot not allowed"])]
