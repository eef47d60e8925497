# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which NVIDIA driver a pinned vllm/vllm-openai image needs, and whether a planned driver branch or an installed
driver version can run it. Pure functions: the module vllm_image_compat and the plan check call them.

The image's CUDA version, from its tag:
- A ``-cuXYZ`` suffix names it: ``v0.32.0-cu129`` is CUDA 12.9, ``-cu130`` CUDA 13.0, ``-cu128`` CUDA 12.8.
- From vLLM 0.20.0 on, the unsuffixed release images are CUDA 13.0 builds and CUDA 12.9 builds carry ``-cu129``:
  vllm-project/vllm#42738 (maintainer reply, 2026-05-15: "After v0.20.0, default wheel/docker nightly version is
  cu130"); ai-dynamo/nixl#2140 ("Starting with vLLM v0.20.0, CUDA 13 became the default ... latest-cu129 remains
  ... a valid CUDA 12.9 tag"); llm-d/llm-d-kv-cache#584 ("The plain :v0.20.2 tag now resolves to a cu130 build",
  pinned to v0.20.2-cu129 for CUDA 12).
- Before 0.20 the unsuffixed images were CUDA 12.x builds (12.8 and 12.9 over the 0.1x releases: vllm-project/vllm
  #37847 quotes the v0.18.0 docs, "binaries compiled with CUDA 12.8 / 12.9 / 13.0"; #30633 reads 0.11.0's wheels as
  CUDA 12.9). Which minor a given old tag used is not recorded here, so it is taken as CUDA 12.8 (the lowest of
  those, R570); a host on R570 with such an image should set the image's CUDA explicitly (onprem_vllm_image_cuda).
  Older than 0.10 is outside what this collection deploys and is treated the same way.

The minimum driver per CUDA toolkit: NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver
Versions" (Linux x86_64, toolkit GA): 13.0 >= 580.65.06, 12.9 >= 575.51.03, 12.8 >= 570.26, 12.6 >= 560.28.03,
12.5 >= 555.42.02, 12.4 >= 550.54.14, 12.3 >= 545.23.06, 12.2 >= 535.54.03, 12.1 >= 530.30.02, 12.0 >= 525.60.13.
NVIDIA's data center support matrix (docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-
versions.html) states the same per branch: R535 and R570 run CUDA 12.x, R580 runs CUDA 13.x. A container whose CUDA
is newer than the driver's is refused by nvidia-container-cli at start ("requirement error: unsatisfied condition:
cuda>=12.4, please update your driver", vllm-project/vllm#5635): the plan check says so before anything changes.
"""

from __future__ import annotations

import re

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_version

# CUDA toolkit (major, minor) -> minimum Linux driver version; its branch is the first field.
CUDA_MIN_DRIVER = {
    (13, 0): "580.65.06",
    (12, 9): "575.51.03",
    (12, 8): "570.26",
    (12, 6): "560.28.03",
    (12, 5): "555.42.02",
    (12, 4): "550.54.14",
    (12, 3): "545.23.06",
    (12, 2): "535.54.03",
    (12, 1): "530.30.02",
    (12, 0): "525.60.13",
}
CUDA13_FROM_VLLM = (0, 20)
OLD_DEFAULT_CUDA = (12, 8)
NEW_DEFAULT_CUDA = (13, 0)

_CU_SUFFIX_RE = re.compile(r"-cu(?P<major>[0-9]{2})(?P<minor>[0-9])(?:$|-)")
_CUDA_RE = re.compile(r"^(?P<major>[0-9]{2})\.(?P<minor>[0-9])(?:\.[0-9]+)?$")
_DRIVER_RE = re.compile(r"^(?P<branch>[1-9][0-9]{2})(?:\.[0-9]+){1,2}$")


def cuda_str(cuda):
    return "%d.%d" % cuda


def _version_tuple(version):
    return tuple(int(part) for part in version.split("."))


def parse_cuda(text):
    """'12.9' or '12.9.1' -> (12, 9); None for anything else."""
    match = _CUDA_RE.match(str(text or "").strip())
    return (int(match.group("major")), int(match.group("minor"))) if match else None


def image_cuda(tag, cuda_override=""):
    """The CUDA version a vllm/vllm-openai tag is built for. Returns (cuda tuple or None, reason, error or None)."""
    tag = str(tag or "").strip()
    if cuda_override:
        cuda = parse_cuda(cuda_override)
        if cuda is None:
            return None, "", ("onprem_vllm_image_cuda=%r is not a CUDA version such as \"12.9\" or \"13.0\" (leave it "
                              "empty to read it from the image tag)" % cuda_override)
        return cuda, "CUDA %s as stated by onprem_vllm_image_cuda" % cuda_str(cuda), None
    release = vllm_version.parse_tag(tag)
    if release is None:
        return None, "", ("onprem_vllm_image_tag=%r is not a vLLM release tag such as v0.32.0 or v0.32.0-cu129: the "
                          "CUDA version the image needs cannot be read from it (pin a release, or state the image's "
                          "CUDA in onprem_vllm_image_cuda)" % tag)
    suffix = _CU_SUFFIX_RE.search(release[1])
    if suffix:
        cuda = (int(suffix.group("major")), int(suffix.group("minor")))
        return cuda, "tag %s names CUDA %s (-cu%d%d)" % (tag, cuda_str(cuda), cuda[0], cuda[1]), None
    vllm = release[0][:2]
    if vllm >= CUDA13_FROM_VLLM:
        return NEW_DEFAULT_CUDA, ("vLLM %d.%d's default image %s is a CUDA %s build (CUDA 13 is the default from "
                                  "vLLM 0.20.0; -cu129 tags are CUDA 12.9)" % (vllm + (tag, cuda_str(NEW_DEFAULT_CUDA)))), None
    return OLD_DEFAULT_CUDA, ("vLLM %d.%d predates the CUDA 13 default (0.20.0): image %s taken as a CUDA %s build"
                              % (vllm + (tag, cuda_str(OLD_DEFAULT_CUDA)))), None


def min_driver(cuda):
    """(13, 0) -> (580, '580.65.06'). A CUDA newer than the table needs at least the newest row's driver; a CUDA
    between rows needs the next row up (e.g. 12.7 -> 12.8's)."""
    candidates = sorted(k for k in CUDA_MIN_DRIVER if k >= cuda)
    key = candidates[0] if candidates else max(CUDA_MIN_DRIVER)
    version = CUDA_MIN_DRIVER[key]
    return int(version.split(".", 1)[0]), version


def newest_cuda_for_branch(branch):
    """The newest CUDA in the table a driver branch runs: 575 -> (12, 9); None below the table."""
    fits = [cuda for cuda, version in CUDA_MIN_DRIVER.items() if int(version.split(".", 1)[0]) <= int(branch)]
    return max(fits) if fits else None


def _suggest_tag(tag, cuda):
    """The tag variant built for `cuda` where the vLLM release publishes one (-cu129 from 0.20 on)."""
    release = vllm_version.parse_tag(tag)
    if release is None or cuda is None:
        return None
    base = "v%d.%d.%d" % release[0]
    vllm = release[0][:2]
    if vllm >= CUDA13_FROM_VLLM and cuda == (12, 9):
        return base + "-cu129"
    if cuda >= NEW_DEFAULT_CUDA and vllm >= CUDA13_FROM_VLLM:
        return base
    return None


def check(tag, cuda_override="", planned_branch="", installed_version=""):
    """Can the image run on the planned driver branch and on the installed (loaded) driver?

    Returns dict(ok, cuda, min_branch, min_version, reasons, errors); each error names what to change."""
    result = {"ok": False, "cuda": None, "min_branch": None, "min_version": None, "reasons": [], "errors": []}
    cuda, reason, error = image_cuda(tag, cuda_override)
    if error:
        result["errors"].append(error)
        return result
    branch_needed, version_needed = min_driver(cuda)
    result.update(cuda=cuda_str(cuda), min_branch=branch_needed, min_version=version_needed)
    result["reasons"].append("%s: needs driver branch R%d or newer (>= %s)" % (reason, branch_needed, version_needed))

    def refusal(what, have_branch):
        newest = newest_cuda_for_branch(have_branch)
        variant = _suggest_tag(tag, newest) if newest else None
        fix = ['set nvidia_driver_branch: "%d" (or newer)' % branch_needed if have_branch < branch_needed
               else "upgrade the driver to %s or newer (nvidia_driver_package_state: latest)" % version_needed]
        if variant and variant != str(tag):
            fix.append("pin onprem_vllm_image_tag: %s (CUDA %s, runs on R%d)" % (variant, cuda_str(newest), have_branch))
        elif newest:
            fix.append("pin a vLLM image built for CUDA %s or older (a vLLM release before 0.20, or a -cu%d%d tag "
                       "where the release has one)" % (cuda_str(newest), newest[0], newest[1]))
        return ("%s cannot run the image: %s is built for CUDA %s, which needs driver branch R%d or newer (>= %s). "
                "Either %s." % (what, tag, cuda_str(cuda), branch_needed, version_needed, ", or ".join(fix)))

    if planned_branch:
        planned = str(planned_branch).strip()
        if not re.match(r"^[1-9][0-9]{2}$", planned):
            result["errors"].append("nvidia_driver_branch=%r is not a driver branch such as \"580\"" % planned)
        elif int(planned) < branch_needed:
            result["errors"].append(refusal("The planned driver branch R%s (nvidia_driver_branch)" % planned,
                                            int(planned)))
        else:
            result["reasons"].append("planned driver branch R%s runs CUDA %s" % (planned, cuda_str(cuda)))
    if installed_version:
        installed = str(installed_version).strip()
        match = _DRIVER_RE.match(installed)
        if not match:
            result["errors"].append("installed driver version %r is not a driver version such as 580.95.05"
                                    % installed)
        elif _version_tuple(installed) < _version_tuple(version_needed):
            result["errors"].append(refusal("The installed driver %s" % installed, int(match.group("branch"))))
        else:
            result["reasons"].append("installed driver %s runs CUDA %s" % (installed, cuda_str(cuda)))
    result["ok"] = not result["errors"]
    return result
