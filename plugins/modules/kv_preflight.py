#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The action plugin plugins/action/kv_preflight.py does the work; this file is its documentation.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kv_preflight
short_description: The KV step of a deployment's preflight in one task - plan the KV cache, refuse a misfit with the fix
version_added: 0.1.0
description:
  - Read-only. Plans the KV cache as M(onprem.vllm.kv_headroom) does and judges the plan. A plan that does not fit
    fails the task, naming the deployment, the host, the planner's reasons and the settings that would fit; one that
    fits returns the plan in RV(kv_plan) and says in RV(msg) how many tokens and full-length requests it holds.
  - Plans on the controller from O(model_config) (the model's facts M(onprem.vllm.hf_model_info) read) or from a
    O(model_config_path) on the controller (O(model_config_on_controller)), with no round trip to the host; a
    O(model_config_path) on the host is looked for there and planned by M(onprem.vllm.kv_headroom) on the host.
  - A missing O(model_config_path) fails with what to do instead.
  - RV(msg) is shown with C(-v) where the plan fits, always where the check was skipped or refused.
  - The role C(onprem.vllm.gpu_preflight) calls it once per deployment (C(tasks/kv_plan.yml)), in the plan check before
    any driver and in the preflight on the GPUs chosen.
author:
  - onprem.vllm developers (@onprem)
extends_documentation_fragment:
  - onprem.vllm.read_only
  - onprem.vllm.kv_plan
options:
  host_name:
    description: The host's name in the messages (the inventory name).
    type: str
    required: true
  deployment_name:
    description: The deployment's name in the refusal (empty where the host's plan has one deployment).
    type: str
    default: ""
  skipped_because:
    description: When set, nothing is planned; RV(msg) says the check was skipped and why, and RV(kv_plan) is empty.
    type: str
    default: ""
  model_config_on_controller:
    description: O(model_config_path) is a path on the controller, not on the host.
    type: bool
    default: false
seealso:
  - module: onprem.vllm.kv_headroom
  - module: onprem.vllm.gpu_preflight
"""

EXAMPLES = r"""
- name: Plan the KV cache of the model hf_model_info read, on the GPU chosen
  onprem.vllm.kv_preflight:
    host_name: "{{ inventory_hostname }}"
    model_config: "{{ model_info.config }}"
    model_weight_bytes: "{{ model_info.weight_bytes }}"
    gpu_memory_bytes: 85520809984
    max_model_len: 32768
    vllm_version: 0.33.0
  register: kv
"""

RETURN = r"""
msg:
  description: What the plan gives each worker (tokens, full-length requests, the pinned pool and the margin), the
    refusal, or why the check was skipped.
  returned: always
  type: str
  sample: 915520 KV-cache tokens, 27.94 concurrent requests of 32768 tokens on each GPU
kv_plan:
  description: The plan's facts, as M(onprem.vllm.kv_headroom) returns them (a misfit's too); empty when skipped.
  returned: when planned or skipped
  type: dict
"""
