#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_image_compat
short_description: Check that a pinned vLLM image can run on the planned or installed NVIDIA driver
version_added: 0.2.0
author:
  - onprem.vllm contributors (@onprem)
description:
  - Pure computation, nothing on the host is read or changed. Reads the CUDA version a C(vllm/vllm-openai) tag is
    built for (a C(-cuXYZ) suffix; CUDA 13.0 for unsuffixed vLLM 0.20 and later; CUDA 12.8 before), maps it to the
    minimum driver (CUDA 13.0 needs R580, 12.9 R575, 12.8 R570, from NVIDIA's CUDA toolkit release notes) and checks
    O(planned_branch) and O(installed_version) against it.
  - The tables and their sources are in C(plugins/module_utils/image_compat.py).
  - A misfit fails the task (O(fail_on_misfit)) with the tag variant or the driver branch to choose.
options:
  image_tag:
    description: The pinned image tag, e.g. C(v0.32.0) or C(v0.32.0-cu129).
    type: str
    required: true
  image_cuda:
    description: The image's CUDA version (C(12.9), C(13.0)) for images whose tag does not say it; empty reads the tag.
    type: str
    default: ""
  planned_branch:
    description: The driver branch the host will run (the nvidia_driver role's C(nvidia_driver_branch)); empty skips.
    type: str
    default: ""
  installed_version:
    description: The driver version the host runs now (C(/proc/driver/nvidia/version), NVML or nvidia-smi); empty skips.
    type: str
    default: ""
  fail_on_misfit:
    description: Fail with RV(errors) instead of returning them.
    type: bool
    default: true
notes:
  - Check mode is supported.
attributes:
  check_mode:
    description: Runs in check mode and returns the same result.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
"""

EXAMPLES = r"""
- name: Refuse a driver branch the image cannot run on
  onprem.vllm.vllm_image_compat:
    image_tag: "{{ onprem_vllm_image_tag }}"
    planned_branch: "{{ nvidia_driver_branch }}"

- name: Check the driver the host runs
  onprem.vllm.vllm_image_compat:
    image_tag: v0.32.0
    installed_version: 580.159.04
"""

RETURN = r"""
cuda:
  description: The CUDA version the image is built for (null when the tag cannot be read).
  returned: always
  type: str
  sample: "13.0"
min_branch:
  description: The oldest driver branch that runs it.
  returned: always
  type: int
  sample: 580
min_version:
  description: The oldest driver version that runs it.
  returned: always
  type: str
  sample: 580.65.06
reasons:
  description: How the answer was reached, one line each.
  returned: always
  type: list
  elements: str
errors:
  description: Refusals, each with the tag variant or driver branch to choose.
  returned: always
  type: list
  elements: str
msg:
  description: One line for the log.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import image_compat


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image_tag=dict(type="str", required=True),
            image_cuda=dict(type="str", default=""),
            planned_branch=dict(type="str", default=""),
            installed_version=dict(type="str", default=""),
            fail_on_misfit=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    res = image_compat.check(p["image_tag"], p["image_cuda"], p["planned_branch"], p["installed_version"])
    out = dict(changed=False, cuda=res["cuda"], min_branch=res["min_branch"], min_version=res["min_version"],
               reasons=res["reasons"], errors=res["errors"],
               msg="; ".join(res["errors"]) if res["errors"] else "; ".join(res["reasons"]))
    if res["errors"] and p["fail_on_misfit"]:
        module.fail_json(**out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
