#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_pci_inventory
short_description: Count and identify the NVIDIA GPUs of a host from PCI sysfs, before any driver is installed
version_added: 0.2.0
author:
  - onprem.vllm contributors (@onprem)
description:
  - Read-only. Lists the NVIDIA GPUs (vendor C(0x10de), PCI class VGA C(0x0300) or 3D controller C(0x0302)) under
    C(<sysfs_root>/bus/pci/devices), names each from its PCI device id and gives its memory, through the table of
    C(plugins/module_utils/gpu_pci.py) (RTX 3090/4090/5090, RTX A6000, RTX 6000 Ada, L40, L40S, A100 40/80 GB,
    H100, H200; each entry cites its source) or O(declared_models) for an id the table lacks.
  - Checks the plan needs no more GPUs than the bus shows (O(tensor_parallel_size) x O(pipeline_parallel_size)) and
    returns the smallest GPU's memory for the KV plan. Refusals are in RV(errors), each saying what to change;
    O(fail_on_misfit) fails the task with them.
  - Needs no NVIDIA driver, no nvidia-smi and no NVML; the full GPU preflight (gpu_topology_info, gpu_health_info) measures
    the exact memory, topology and health once the driver is in.
options:
  sysfs_root:
    description:
      - Where sysfs is mounted. The documented seam for tests and for simulated hosts (a tree with
        C(bus/pci/devices/<address>/{vendor,device,class})).
    type: path
    default: /sys
  declared_models:
    description:
      - "GPUs the table does not know, keyed by PCI device id, e.g. C({'0x2321': {name: NVIDIA H100 NVL, memory_mib: 95830}}).
        A declaration also overrides the table's entry for that id."
      - The memory is in MiB, as nvidia-smi reports the card's total.
    type: dict
    default: {}
  tensor_parallel_size:
    description: GPUs per pipeline stage of the planned server.
    type: int
    default: 1
  pipeline_parallel_size:
    description: Pipeline stages of the planned server.
    type: int
    default: 1
  fail_on_misfit:
    description: Fail with RV(errors) instead of returning them.
    type: bool
    default: true
notes:
  - Check mode is supported; the module never changes anything.
attributes:
  check_mode:
    description: Runs in check mode and returns the same facts.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
"""

EXAMPLES = r"""
- name: Count the GPUs a bare workstation has
  onprem.vllm.gpu_pci_inventory:
    tensor_parallel_size: 2
  register: pci

- name: A simulated host's sysfs tree, and a card the table lacks
  onprem.vllm.gpu_pci_inventory:
    sysfs_root: /srv/sim/sys
    declared_models:
      "0x2321": {name: NVIDIA H100 NVL, memory_mib: 95830}
    tensor_parallel_size: 2
    fail_on_misfit: false
  register: pci
"""

RETURN = r"""
gpus:
  description: The NVIDIA GPUs with a known model, in PCI address order.
  returned: always
  type: list
  elements: dict
  sample: [{"address": "0000:01:00.0", "device_id": "0x2684", "name": "NVIDIA GeForce RTX 4090",
            "memory_bytes": 25757220864, "source": "table"}]
gpu_count:
  description: NVIDIA GPUs on the bus, known or not.
  returned: always
  type: int
unknown:
  description: NVIDIA GPUs whose device id is neither in the table nor declared.
  returned: always
  type: list
  elements: dict
models:
  description: The distinct model names found.
  returned: always
  type: list
  elements: str
needed:
  description: GPUs the plan needs (TP x PP).
  returned: always
  type: int
gpu_memory_bytes:
  description: Memory of the smallest GPU found (0 when the plan does not fit or a GPU is unknown).
  returned: always
  type: int
errors:
  description: Refusals, each with what to change.
  returned: always
  type: list
  elements: str
msg:
  description: One line for the log.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_pci


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            declared_models=dict(type="dict", default={}),
            tensor_parallel_size=dict(type="int", default=1),
            pipeline_parallel_size=dict(type="int", default=1),
            fail_on_misfit=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    found = gpu_pci.inventory(gpu_pci.read_pci_devices(p["sysfs_root"]), p["declared_models"])
    planned = gpu_pci.plan(found, p["tensor_parallel_size"], p["pipeline_parallel_size"])
    msg = "%d NVIDIA GPU(s) on the PCI bus (%s); the plan needs %d" % (
        found["gpu_count"], ", ".join(planned["models"]) or "none known", planned["needed"])
    result = dict(changed=False, gpus=found["gpus"], gpu_count=found["gpu_count"], unknown=found["unknown"],
                  models=planned["models"], needed=planned["needed"], gpu_memory_bytes=planned["gpu_memory_bytes"],
                  errors=planned["errors"], msg=msg)
    if planned["errors"] and p["fail_on_misfit"]:
        result["msg"] = "; ".join(planned["errors"])
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
