#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology_info
short_description: Report NVIDIA GPUs, their links and P2P status, and choose a GPU set for tensor parallelism
version_added: 0.1.0
description:
  - Read-only. Collects the driver and CUDA driver versions, every NVIDIA GPU (UUID, PCI bus id, memory, compute
    capability, PCIe link, NUMA node, persistence mode, processes holding memory), the link type and P2P status of
    every GPU pair and whether an NVSwitch fabric is present.
  - Two backends return the same shape. C(nvml) uses nvidia-ml-py (module C(pynvml)) on the target;
    C(nvidia-smi) parses C(nvidia-smi -q -x), C(nvidia-smi topo -m) and C(nvidia-smi topo -p2p r|w|n) only, so
    recorded outputs can be replayed by a stand-in binary.
  - A host without an NVIDIA driver or GPU returns C(gpus=[]), a O(ignore:status) keyword and a clear C(msg);
    the module does not fail for that.
  - When O(tensor_parallel_size) is given, the result also holds C(plan) - the chosen GPU set, the NCCL
    environment for it and a one-line reason for each choice.
author:
  - onprem.vllm developers (@onprem)
extends_documentation_fragment:
  - onprem.vllm.read_only
  - onprem.vllm.gpu_source
options:
  tensor_parallel_size:
    description:
      - When set, choose this many GPUs and derive the NCCL environment for them (returned as C(plan)).
    type: int
  gpu_uuids:
    description:
      - Restrict the choice to these GPU UUIDs. A UUID that is not present is reported in C(plan.msg).
    type: list
    elements: str
  exclude_gpu_uuids:
    description:
      - GPUs not to choose, those the host's earlier deployments took (several deployments on one host get disjoint
        GPU sets).
    type: list
    elements: str
    default: []
  p2p_risks:
    description:
      - Host findings that make PCIe P2P unsafe even when the driver reports OK (for example PCIe ACS redirect or a
        translating IOMMU, as returned by M(onprem.vllm.gpu_health_info) in C(p2p_risks)). Non-empty turns P2P off for
        PCIe-connected sets.
    type: list
    elements: str
    default: []
  allowed_process_names:
    description:
      - Process names whose GPU memory does not count as foreign in C(plan.foreign_memory_bytes).
    type: list
    elements: str
    default: []
  allowed_pids:
    description:
      - Host PIDs whose GPU memory does not count as foreign, e.g. the processes of the vLLM container a rollout
        is about to replace.
    type: list
    elements: int
    default: []
  allowed_container_names:
    description:
      - Docker containers whose processes' GPU memory does not count as foreign (C(docker top)), e.g. the vLLM server
        a rollout is about to replace and the host's other servers. A container that does not exist, or a host
        without Docker, adds nothing.
    type: list
    elements: str
    default: []
notes:
  - Check mode is supported; the module never changes anything.
  - nvidia-smi does not report the compute capability; with that backend it comes from a table keyed by architecture
    and product name (C(compute_capability_source=architecture-table)).
seealso:
  - module: onprem.vllm.gpu_health_info
"""

EXAMPLES = r"""
- name: Collect GPU topology
  onprem.vllm.gpu_topology_info:
  register: topo

- name: Choose two GPUs for tensor parallelism, from recorded nvidia-smi output
  onprem.vllm.gpu_topology_info:
    backend: nvidia-smi
    nvidia_smi_path: /opt/fixtures/fake-nvidia-smi
    tensor_parallel_size: 2
  register: topo

- name: Show the plan
  ansible.builtin.debug:
    msg: "{{ topo.plan.selected_uuids }} {{ topo.plan.nccl_env }}"
"""

RETURN = r"""
status:
  description: ok, no_gpu, no_driver, no_nvml, driver_library_mismatch, gpu_lost, no_permission or error.
  returned: always
  type: str
  sample: ok
msg:
  description: One line about what was found.
  returned: always
  type: str
  sample: "nvidia-smi: 1 GPU(s)"
backend:
  description: The backend that produced the facts.
  returned: always
  type: str
  sample: nvml
warnings_list:
  description: Non-fatal problems met while collecting (a failed C(topo -p2p w), ...).
  returned: always
  type: list
  elements: str
driver_version:
  description: NVIDIA driver version.
  returned: always
  type: str
  sample: 580.159.04
cuda_driver_version:
  description: Highest CUDA version the driver supports.
  returned: always
  type: str
  sample: "13.0"
gpu_count:
  description: Number of GPUs found.
  returned: always
  type: int
  sample: 1
gpus:
  description:
    - One entry per GPU with index, uuid, name, architecture, pci_bus_id, memory_total_bytes, memory_used_bytes,
      memory_reserved_bytes, compute_capability, compute_capability_source, pcie_gen, pcie_width, pcie_gen_max,
      pcie_width_max, numa_node, cpu_affinity, persistence_mode, mig_mode, processes (pid, name, type,
      used_memory_bytes), ecc (mode_enabled, volatile_uncorrected, aggregate_uncorrected, retired_pages_sbe,
      retired_pages_dbe, retired_pages_pending, remapped_rows_correctable, remapped_rows_uncorrectable,
      remapped_rows_pending, remapped_rows_failure), recovery_action and fabric_state.
  returned: always
  type: list
  elements: dict
links:
  description:
    - For every GPU pair C("i-j") (i < j) the link type as nvidia-smi names it (NV#, PIX, PXB, PHB, NODE, SYS),
      nvlink_count, and p2p_read, p2p_write, p2p_nvlink (OK, CNS, GNS, TNS, NS, DR, U; null when not reported).
  returned: always
  type: dict
  sample: {"0-1": {"type": "PHB", "nvlink_count": 0, "p2p_read": "GNS", "p2p_write": "GNS", "p2p_nvlink": "NS"}}
nvswitch:
  description: Whether an NVSwitch fabric is present (present) and the evidence for it.
  returned: always
  type: dict
  sample: {"present": false, "evidence": []}
plan:
  description:
    - Only with O(tensor_parallel_size). ok, msg, selected_indices, selected_uuids, reasons (one line per choice),
      nccl_env (dict of strings), disable_custom_all_reduce, gpu_memory_bytes (smallest total of the chosen GPUs),
      foreign_memory_bytes (per chosen UUID) and min_compute_capability.
  returned: when tensor_parallel_size is set
  type: dict
elapsed_s:
  description: Seconds spent collecting (and planning), measured inside the module.
  returned: always
  type: float
  sample: 0.21
"""

import os
import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_nvml, gpu_select


ARGUMENT_SPEC = dict(
    backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
    nvidia_smi_path=dict(type="path"),
    tensor_parallel_size=dict(type="int"),
    gpu_uuids=dict(type="list", elements="str"),
    exclude_gpu_uuids=dict(type="list", elements="str", default=[]),
    p2p_risks=dict(type="list", elements="str", default=[]),
    allowed_process_names=dict(type="list", elements="str", default=[]),
    allowed_pids=dict(type="list", elements="int", default=[]),
    allowed_container_names=dict(type="list", elements="str", default=[]),
)


def container_pids(module, names):
    """The host PIDs of the processes of each named container that exists (docker top)."""
    docker = module.get_bin_path("docker") if names else None
    pids = []
    for name in names if docker else []:
        rc, out, _err = module.run_command([docker, "top", name, "-eo", "pid"])
        if rc == 0:
            pids.extend(int(line.strip()) for line in out.splitlines() if line.strip().isdigit())
    return pids


def run_module(module):
    params = module.params
    smi_path = params["nvidia_smi_path"]
    if smi_path and not os.path.exists(smi_path):
        module.fail_json(msg="nvidia_smi_path %s does not exist" % smi_path)
    if not smi_path:
        smi_path = module.get_bin_path("nvidia-smi")
    started = time.monotonic()

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    collected = gpu_nvml.collect_topology(params["backend"], run, smi_path)
    facts = collected["facts"] or {}
    gpus = facts.get("gpus") or []
    result = dict(
        changed=False,
        status=collected["status"],
        msg=collected["msg"],
        backend=collected["backend"],
        warnings_list=collected["warnings"],
        driver_version=facts.get("driver_version"),
        cuda_driver_version=facts.get("cuda_driver_version"),
        gpu_count=len(gpus),
        gpus=gpus,
        links=facts.get("links") or {},
        nvswitch=facts.get("nvswitch") or {"present": False, "evidence": []},
    )
    if params["tensor_parallel_size"] is not None:
        excluded = set(params["exclude_gpu_uuids"])
        result["plan"] = gpu_select.plan(
            {"gpus": [gpu for gpu in gpus if gpu.get("uuid") not in excluded], "links": result["links"]},
            params["tensor_parallel_size"],
            gpu_uuids=params["gpu_uuids"],
            p2p_risks=params["p2p_risks"],
            allowed_process_names=params["allowed_process_names"],
            allowed_pids=params["allowed_pids"] + container_pids(module, params["allowed_container_names"]),
        )
        if not gpus and not result["plan"]["ok"]:
            result["plan"]["msg"] = "%s (%s)" % (result["plan"]["msg"], collected["msg"])
    result["elapsed_s"] = round(time.monotonic() - started, 4)
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        run_module(module)
    except Exception as exc:  # a clear message instead of a bare traceback
        module.fail_json(msg="gpu_topology_info failed unexpectedly: %s" % exc, exception=traceback.format_exc())


if __name__ == "__main__":
    main()
