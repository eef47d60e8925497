#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The action plugin plugins/action/gpu_preflight.py does the work; this file is its documentation.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_preflight
short_description: One deployment's GPU preflight in one task - health, topology, the GPUs chosen, every refusal at once
version_added: 0.1.0
description:
  - Read-only. Runs M(onprem.vllm.gpu_health_info) and M(onprem.vllm.gpu_topology_info) on the host (two round trips),
    then decides on the controller (C(plugins/module_utils/gpu_preflight_verdict.py)).
  - Fails with every refusal at once - GPU health (an Xid, an ECC error, a driver/library mismatch; in CPU mode too),
    then, with GPUs, no NVIDIA GPU, no GPU set of O(tensor_parallel_size), other processes' GPU memory over
    O(max_foreign_memory_bytes), health warnings where O(fail_on_warnings), and the loaded driver against the CUDA of
    O(image_tag).
  - Otherwise returns the GPUs chosen in RV(choice) (in CPU mode, none) and shows why in RV(msg). FP8 on GPUs without
    native FP8 (compute capability below 8.9) and the health and topology warnings are Ansible warnings.
  - The role C(onprem.vllm.gpu_preflight) calls it once per deployment and plans the KV cache on RV(choice).
author:
  - onprem.vllm developers (@onprem)
extends_documentation_fragment:
  - onprem.vllm.read_only
  - onprem.vllm.gpu_source
options:
  host_name:
    description: The host's name in the messages (the inventory name).
    type: str
    required: true
  cpu_mode:
    description: The plan serves on the CPU (the lab); GPUs found are ignored, only their health counts.
    type: bool
    default: false
  tensor_parallel_size:
    description: The number of GPUs to choose.
    type: int
    required: true
  kernel_log_path:
    description: Passed to M(onprem.vllm.gpu_health_info) (a file to read Xid events from).
    type: path
  ignore_xids:
    description: Xid codes that do not block (M(onprem.vllm.gpu_health_info)).
    type: list
    elements: int
    default: []
  xids_after:
    description:
      - Only Xids logged after this time (ISO 8601 with its offset) count; a refusal for a later one says how to
        confirm a fix (a GPU return).
    type: str
    default: ""
  gpu_uuids:
    description: Choose only among these GPUs (the operator's restriction, or the GPU a shared deployment's owner took).
    type: list
    elements: str
    default: []
  exclude_gpu_uuids:
    description: GPUs the host's earlier deployments took.
    type: list
    elements: str
    default: []
  allowed_process_names:
    description: Process names whose GPU memory is not foreign.
    type: list
    elements: str
    default: []
  allowed_container_names:
    description:
      - Containers whose processes' GPU memory is not foreign (the server a rollout replaces and the host's other
        servers); ignored in CPU mode.
    type: list
    elements: str
    default: []
  max_foreign_memory_bytes:
    description: The GPU memory other processes may hold on a chosen GPU.
    type: int
    default: 1073741824
  fail_on_warnings:
    description: Refuse on GPU health warnings too.
    type: bool
    default: false
  quantization:
    description: The model's quantization (for the FP8 warning).
    type: str
    default: ""
  model_dtype:
    description: The model's dtype (for the FP8 warning).
    type: str
    default: auto
  driver_image_check:
    description: Check the loaded driver runs the CUDA of O(image_tag) (C(plugins/module_utils/image_compat.py)).
    type: bool
    default: true
  image_tag:
    description: The pinned vLLM image tag.
    type: str
    default: ""
  image_cuda:
    description: The image's CUDA version where its tag does not say it.
    type: str
    default: ""
seealso:
  - module: onprem.vllm.gpu_health_info
  - module: onprem.vllm.gpu_topology_info
"""

EXAMPLES = r"""
- name: Check the GPUs and choose two for tensor parallelism
  onprem.vllm.gpu_preflight:
    host_name: "{{ inventory_hostname }}"
    tensor_parallel_size: 2
    allowed_container_names: [vllm]
    image_tag: v0.32.0
  register: preflight
"""

RETURN = r"""
msg:
  description: The GPUs chosen and why (or CPU mode), or every refusal.
  returned: always
  type: str
choice:
  description: The GPUs chosen; empty where the preflight refused.
  returned: always
  type: dict
  contains:
    cpu_mode:
      description: No GPU used.
      type: bool
    gpu_uuids:
      description: The chosen GPUs' UUIDs.
      type: list
      elements: str
    nccl_env:
      description: NCCL environment variables for the chosen set (for example C(NCCL_P2P_DISABLE)).
      type: dict
    disable_custom_all_reduce:
      description: Whether vLLM's custom all-reduce must be off for the set.
      type: bool
    gpu_memory_bytes:
      description: The memory of each chosen GPU.
      type: int
    reasons:
      description: Why this set.
      type: list
      elements: str
warnings_list:
  description: The FP8, health and topology warnings (also shown as Ansible warnings).
  returned: always
  type: list
  elements: str
"""
