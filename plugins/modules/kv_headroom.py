#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kv_headroom
short_description: Predict vLLM's KV-cache size and concurrency on a host before rollout
version_added: 0.1.0
author:
  - onprem.vllm contributors (@onprem)
description:
  - Reads the planned model's C(config.json) and predicts, per GPU worker, how much memory vLLM will give the KV
    cache, how many blocks and tokens that makes, and how many full-length requests it serves at once.
  - Checks vLLM's startup constraints (TP divides the attention heads, KV heads and TP divide one another, block-FP8
    MoE shards, max_model_len against the config, one request of max_model_len fits, min_concurrency, instances
    sharing a GPU) and fails with the fix when the plan will not start.
  - Pure computation; nothing on the host changes. Models with sliding-window or hybrid attention are not predicted
    (the reasons say so).
  - For the CPU backend (the lab) set O(device=cpu); the KV space is then O(cpu_kv_cache_space_bytes)
    (vLLM's C(VLLM_CPU_KVCACHE_SPACE)) and O(gpu_memory_bytes) is not needed.
options:
  fail_on_misfit:
    description: Fail the task when the plan does not fit; the message carries the suggested fix.
    type: bool
    default: true
notes:
  - Supports check mode; the module never changes anything.
  - The non-KV memory (activation peak, non-torch memory, CUDA-graph estimate) is estimated from constants fitted on
    public vLLM startup logs; see C(docs/kv_headroom.md) for the measured accuracy.
extends_documentation_fragment:
  - onprem.vllm.kv_plan
seealso:
  - module: onprem.vllm.gpu_topology_info
  - module: onprem.vllm.kv_preflight
"""

EXAMPLES = r"""
- name: Check that Qwen3-30B-A3B-FP8 at TP2 fits with room for 8 full-length requests
  onprem.vllm.kv_headroom:
    model_config_path: /srv/hf/hub/models--Qwen--Qwen3-30B-A3B-FP8
    gpu_topology: "{{ gpu_topology }}"
    tensor_parallel_size: 2
    max_model_len: 32768
    min_concurrency: 8
    vllm_version: 0.33.0

- name: Predict the lab's CPU backend KV space (VLLM_CPU_KVCACHE_SPACE=1)
  onprem.vllm.kv_headroom:
    model_config_path: /srv/lab/tiny-model
    device: cpu
    cpu_kv_cache_space_bytes: 1073741824
  register: lab_kv
"""

RETURN = r"""
kv_bytes_per_token:
  description: KV-cache bytes one token takes on one worker (all its layers).
  returned: always
  type: int
  sample: 49152
weights_bytes_per_gpu:
  description: Weight memory of one worker, given or computed (null on the CPU path without it).
  returned: always
  type: int
  sample: 15582469632
weights_source:
  description: Where weights_bytes_per_gpu came from (given, safetensors, estimated from config.json).
  returned: always
  type: str
  sample: safetensors
available_kv_cache_bytes:
  description: Memory vLLM will hand to the KV cache on one worker.
  returned: always
  type: int
  sample: 45000000000
num_gpu_blocks:
  description: KV blocks vLLM will allocate (including the null block); null for models the formula does not cover.
  returned: always
  type: int
  sample: 57220
kv_cache_tokens:
  description: The token count vLLM logs as C(GPU KV cache size) / C(CPU KV cache size).
  returned: always
  type: int
  sample: 915520
max_concurrency:
  description: vLLM's C(Maximum concurrency for max_model_len tokens per request).
  returned: always
  type: float
  sample: 27.94
max_model_len:
  description: The max_model_len the plan used.
  returned: always
  type: int
  sample: 32768
gpu_memory_utilization:
  description: The utilization the plan used (null on the CPU path or with available_kv_cache_bytes).
  returned: always
  type: float
  sample: 0.92
non_kv_bytes:
  description: >-
    The estimated parts of the budget that are not KV cache, per worker (C(cudagraph): the estimate vLLM subtracts
    inside the budget), and C(cudagraph_outside_budget): the CUDA graphs vLLM's model runner V2 captures beside the
    budget (vLLM 0.26 and later), which the plan checks the GPU holds.
  returned: always
  type: dict
  sample: {"activation_peak": 1500000000, "non_torch": 480000000, "cudagraph": 640000000,
           "cudagraph_outside_budget": 0}
fits:
  description: Whether vLLM will start with this plan and meet min_concurrency.
  returned: always
  type: bool
  sample: true
covered:
  description: False when the model's attention layout (sliding window, hybrid) is outside the planner's formula.
  returned: always
  type: bool
  sample: true
reasons:
  description: Why it does not fit or cannot be predicted, in vLLM's wording where vLLM has one.
  returned: always
  type: list
  elements: str
  sample: []
notes:
  description: How the numbers were obtained (e.g. only block arithmetic, CPU backend).
  returned: always
  type: list
  elements: str
  sample: []
suggestions:
  description: >-
    Settings that would fit: the largest max_model_len, and when it does not fit the gpu_memory_utilization,
    tensor_parallel_size or kv_cache_dtype that would. The failure message lists them with their numbers.
  returned: always
  type: dict
  sample: {"max_model_len": 40960}
kv_cache_memory_bytes:
  description: >-
    The C(--kv-cache-memory-bytes) the server is to be given for O(kv_cache_memory) (null when nothing is pinned, or
    on the CPU backend with C(auto), where C(VLLM_CPU_KVCACHE_SPACE) pins the pool).
  returned: always
  type: int
  sample: 76541263872
kv_cache_memory_margin_bytes:
  description: The margin C(auto) left below the prediction (0 otherwise).
  returned: always
  type: int
  sample: 1580547965
fit_margin_bytes:
  description: >-
    What the fit check keeps back from the predicted available KV memory (vLLM 0.26 and later, nothing pinned): the
    margin of the model's family and mode, derived from the most the prediction claimed above vLLM's own profile on
    measured startups; a plan fits only what fits in the prediction less it. The notes say how it was derived.
  returned: always
  type: int
  sample: 157286400
margin_family:
  description: The family and mode the margin was taken from (e.g. C(sliding window, compiled)); empty when none.
  returned: always
  type: str
  sample: dense, compiled
cannot_fit:
  description: >-
    On a misfit, the knobs that cannot fix it on their own, with the number that shows it (e.g. the utilization it
    would take above 0.98).
  returned: always
  type: list
  elements: str
  sample: ["no gpu_memory_utilization fits at tensor_parallel_size 1: it would take 1.37, above 0.98"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils.kv_request import (
    ARGUMENT_SPEC,
    ModelConfigError,
    PlanInputError,
    build_request,
    plan,
    result_facts,
    summary,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(ARGUMENT_SPEC, fail_on_misfit=dict(type="bool", default=True)),
        required_one_of=[("model_config_path", "model_config")],
        mutually_exclusive=[("model_config_path", "model_config")],
        supports_check_mode=True,
    )
    try:
        result = plan(build_request(module.params))
    except (PlanInputError, ModelConfigError) as exc:
        module.fail_json(msg=str(exc))
    facts = result_facts(result)
    if not result.fits and module.params["fail_on_misfit"]:
        module.fail_json(msg=summary(result), **facts)
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
