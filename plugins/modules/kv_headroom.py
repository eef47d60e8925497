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
  model_config_path:
    description:
      - A C(config.json), a checkpoint directory holding one, an HF cache repo folder (C(models--Org--Name)) or one
        of its snapshots. Multimodal configs are resolved to their C(text_config).
      - When the directory holds safetensors, the weight size comes from C(model.safetensors.index.json) or the
        safetensors headers.
      - Exactly one of O(model_config_path) and O(model_config) is given.
    type: path
  model_config:
    description:
      - The parsed C(config.json), as C(onprem.vllm.hf_model_info) returns it from the model itself (the host's cache,
        an archive or the hub).
    type: dict
  model_weight_bytes:
    description:
      - With O(model_config), the checkpoint's weight size (C(onprem.vllm.hf_model_info)'s C(weight_bytes)); when
        omitted, the size the config implies.
    type: int
  device:
    description: Which vLLM backend is planned.
    type: str
    choices: [cuda, cpu]
    default: cuda
  gpu_memory_bytes:
    description:
      - Total memory of one GPU in bytes, as CUDA reports it.
      - When omitted, taken from O(gpu_topology) (the smallest GPU of O(gpu_indices)).
    type: int
  gpu_topology:
    description:
      - Facts returned by C(onprem.vllm.gpu_topology_info) (a dict with a C(gpus) list, or the list itself); used for
        O(gpu_memory_bytes) and the GPU name when those are not given.
    type: raw
  gpu_indices:
    description: GPUs of O(gpu_topology) the server will use; all when omitted.
    type: list
    elements: int
  gpu_memory_utilization:
    description: vLLM's C(--gpu-memory-utilization); defaults to the O(vllm_version)'s default (0.9, 0.92 from 0.20).
    type: float
  tensor_parallel_size:
    description: vLLM's C(--tensor-parallel-size).
    type: int
    default: 1
  pipeline_parallel_size:
    description: vLLM's C(--pipeline-parallel-size).
    type: int
    default: 1
  enable_expert_parallel:
    description: vLLM's C(--enable-expert-parallel).
    type: bool
    default: false
  max_model_len:
    description: vLLM's C(--max-model-len); defaults to the model's derived maximum.
    type: int
  kv_cache_dtype:
    description: vLLM's C(--kv-cache-dtype); C(auto) is the model dtype (16 bit), C(fp8*) is 1 byte.
    type: str
    choices: [auto, fp8, fp8_e4m3, fp8_e5m2]
    default: auto
  block_size:
    description: vLLM's C(--block-size) in tokens.
    type: int
    default: 16
  max_num_batched_tokens:
    description: vLLM's C(--max-num-batched-tokens); defaults to vLLM's (8192 on 70 GiB+ non-A100 GPUs, else 2048).
    type: int
  max_num_seqs:
    description: vLLM's C(--max-num-seqs); defaults to vLLM's (1024 on 70 GiB+ non-A100 GPUs, else 256).
    type: int
  vllm_version:
    description: The vLLM version that will run (the image tag without C(v)).
    type: str
    default: 0.33.0
  enforce_eager:
    description: vLLM's C(--enforce-eager) (no CUDA graphs, so no CUDA-graph estimate from 0.21 on).
    type: bool
    default: false
  weights_bytes_per_gpu:
    description: Weight memory of one worker; else from the safetensors sizes, else estimated from the config.
    type: int
  available_kv_cache_bytes:
    description: Memory for the KV cache per worker, like vLLM's C(--kv-cache-memory); only the block arithmetic runs.
    type: int
  cpu_kv_cache_space_bytes:
    description: KV space of the CPU backend in bytes (C(VLLM_CPU_KVCACHE_SPACE) GiB x 2^30); 4 GiB when omitted.
    type: int
  kv_cache_memory:
    description:
      - The server's pinned KV pool (vllm_server_kv_cache_memory), planned as the server will run it.
      - Empty - vLLM profiles; the plan predicts what the profiler leaves of utilization x memory.
      - C(auto) - the prediction less the margin (RV(fit_margin_bytes), or O(kv_cache_memory_margin_pct) of the budget
        where given), in whole blocks, returned as
        RV(kv_cache_memory_bytes) for C(--kv-cache-memory-bytes); tokens and concurrency are those of that pool.
        On the CPU backend the pool stays C(VLLM_CPU_KVCACHE_SPACE) (already pinned; nothing to render).
      - Bytes - the plan uses that pool instead of utilization x memory and fails when it and the estimated non-KV
        memory exceed 0.98 of the GPU.
      - Fails for a O(vllm_version) without C(--kv-cache-memory-bytes) (before 0.10.2; on the CPU backend, 0.20).
    type: str
    default: ""
  kv_cache_memory_margin_pct:
    description:
      - The margin of C(auto), in % of the budget (utilization x GPU memory), instead of the derived one.
      - Unset, vLLM 0.26 and later take the margin of the model's family and mode (eager or compiled), derived from
        the measured spread of the prediction (RV(fit_margin_bytes), RV(margin_family)); earlier releases 2 %.
    type: float
  min_concurrency:
    description: Fail unless this many requests of O(max_model_len) fit in the KV cache at once.
    type: float
  co_located_utilizations:
    description: C(gpu_memory_utilization) of other vLLM instances sharing these GPUs.
    type: list
    elements: float
    default: []
  allow_long_max_model_len:
    description: The server sets C(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), so O(max_model_len) may exceed the config's.
    type: bool
    default: false
  limit_mm_per_prompt:
    description:
      - The server's C(--limit-mm-per-prompt) for a vision-language model, as a mapping of modality to count
        (C(image), C(video)); a modality left out keeps vLLM's default of 999.
      - With every modality the model serves at 0, vLLM runs it text-only and neither loads nor profiles its vision
        encoder; otherwise the plan counts the encoder's weights and, where vLLM profiles it, its largest item.
    type: dict
  fail_on_misfit:
    description: Fail the task when the plan does not fit; the message carries the suggested fix.
    type: bool
    default: true
notes:
  - Supports check mode; the module never changes anything.
  - The non-KV memory (activation peak, non-torch memory, CUDA-graph estimate) is estimated from constants fitted on
    public vLLM startup logs; see C(docs/kv_headroom.md) for the measured accuracy.
seealso:
  - module: onprem.vllm.gpu_topology_info
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

from ansible_collections.onprem.vllm.plugins.module_utils.kv_cache import (
    DEFAULT_VLLM_VERSION,
    PlanInputError,
    PlanRequest,
    parse_kv_cache_memory,
    plan,
    summary,
)
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import ModelConfigError, load_model_shape, shape_with_weights


def gpu_from_topology(topology, indices):
    """(memory bytes CUDA will report, name) of the smallest selected GPU in gpu_topology facts."""
    gpus = topology.get("gpus") if isinstance(topology, dict) else topology
    if not isinstance(gpus, list) or not gpus:
        raise PlanInputError("gpu_topology has no gpus list: pass the facts returned by onprem.vllm.gpu_topology_info "
                             "or set gpu_memory_bytes")
    chosen = [g for g in gpus if isinstance(g, dict) and (not indices or g.get("index") in indices)]
    sizes = []
    for gpu in chosen:
        total = gpu.get("memory_total_bytes")
        if isinstance(total, int) and total > 0:
            # CUDA's total excludes what the driver reserves
            sizes.append((total - (gpu.get("memory_reserved_bytes") or 0), str(gpu.get("name") or "")))
    if not sizes:
        raise PlanInputError("gpu_topology lists no memory_total_bytes for gpu_indices %s: set gpu_memory_bytes"
                             % (indices or "all",))
    return min(sizes)


def build_request(params):
    if params["model_config"] is not None:
        shape = shape_with_weights(params["model_config"], "the model's config.json", params["model_weight_bytes"])
    else:
        shape = load_model_shape(params["model_config_path"])
    gpu_bytes = params["gpu_memory_bytes"]
    gpu_name = ""
    if params["device"] == "cuda" and gpu_bytes is None and params["gpu_topology"] is not None:
        gpu_bytes, gpu_name = gpu_from_topology(params["gpu_topology"], params["gpu_indices"])
    return PlanRequest(
        shape=shape,
        gpu_memory_bytes=gpu_bytes,
        gpu_memory_utilization=params["gpu_memory_utilization"],
        tensor_parallel_size=params["tensor_parallel_size"],
        pipeline_parallel_size=params["pipeline_parallel_size"],
        enable_expert_parallel=params["enable_expert_parallel"],
        max_model_len=params["max_model_len"],
        kv_cache_dtype=params["kv_cache_dtype"],
        block_size=params["block_size"],
        max_num_batched_tokens=params["max_num_batched_tokens"],
        max_num_seqs=params["max_num_seqs"],
        vllm_version=params["vllm_version"],
        weights_bytes_per_gpu=params["weights_bytes_per_gpu"],
        available_kv_cache_bytes=params["available_kv_cache_bytes"],
        min_concurrency=params["min_concurrency"],
        device=params["device"],
        cpu_kv_cache_space_bytes=params["cpu_kv_cache_space_bytes"],
        enforce_eager=params["enforce_eager"],
        gpu_name=gpu_name,
        co_located_utilizations=params["co_located_utilizations"],
        allow_long_max_model_len=params["allow_long_max_model_len"],
        # counts may arrive as strings from a template
        limit_mm_per_prompt=None if params["limit_mm_per_prompt"] is None else {
            str(name): int(count) if str(count).isdigit() else count
            for name, count in params["limit_mm_per_prompt"].items()},
        kv_cache_memory=parse_kv_cache_memory(params["kv_cache_memory"]),
        kv_cache_memory_margin=(None if params["kv_cache_memory_margin_pct"] is None
                                else params["kv_cache_memory_margin_pct"] / 100.0),
    )


def result_facts(result):
    covered = result.covered
    return {
        "kv_bytes_per_token": result.kv_bytes_per_token,
        "weights_bytes_per_gpu": result.weights_bytes_per_gpu,
        "weights_source": result.weights_source,
        "available_kv_cache_bytes": result.available_kv_cache_bytes,
        "num_gpu_blocks": result.num_gpu_blocks if covered else None,
        "kv_cache_tokens": result.kv_cache_tokens if covered else None,
        "max_concurrency": result.max_concurrency if covered else None,
        "max_model_len": result.max_model_len,
        "gpu_memory_utilization": result.gpu_memory_utilization,
        "non_kv_bytes": {"activation_peak": result.activation_peak_bytes, "non_torch": result.non_torch_bytes,
                         "cudagraph": result.cudagraph_bytes,
                         "cudagraph_outside_budget": result.cudagraph_outside_bytes},
        "fits": result.fits,
        "covered": covered,
        "reasons": result.reasons,
        "notes": result.notes,
        "suggestions": result.suggestions,
        "cannot_fit": result.cannot_fit,
        "kv_cache_memory_bytes": result.kv_cache_memory_bytes,
        "kv_cache_memory_margin_bytes": result.kv_cache_memory_margin_bytes,
        "fit_margin_bytes": result.fit_margin_bytes,
        "margin_family": result.margin_family,
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model_config_path=dict(type="path"),
            model_config=dict(type="dict"),
            model_weight_bytes=dict(type="int"),
            device=dict(type="str", choices=["cuda", "cpu"], default="cuda"),
            gpu_memory_bytes=dict(type="int"),
            gpu_topology=dict(type="raw"),
            gpu_indices=dict(type="list", elements="int"),
            gpu_memory_utilization=dict(type="float"),
            tensor_parallel_size=dict(type="int", default=1),
            pipeline_parallel_size=dict(type="int", default=1),
            enable_expert_parallel=dict(type="bool", default=False),
            max_model_len=dict(type="int"),
            kv_cache_dtype=dict(type="str", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"], default="auto"),
            block_size=dict(type="int", default=16),
            max_num_batched_tokens=dict(type="int", no_log=False),
            max_num_seqs=dict(type="int"),
            vllm_version=dict(type="str", default=DEFAULT_VLLM_VERSION),
            enforce_eager=dict(type="bool", default=False),
            weights_bytes_per_gpu=dict(type="int"),
            available_kv_cache_bytes=dict(type="int"),
            cpu_kv_cache_space_bytes=dict(type="int"),
            min_concurrency=dict(type="float"),
            co_located_utilizations=dict(type="list", elements="float", default=[]),
            allow_long_max_model_len=dict(type="bool", default=False),
            limit_mm_per_prompt=dict(type="dict"),
            fail_on_misfit=dict(type="bool", default=True),
            kv_cache_memory=dict(type="str", default=""),
            kv_cache_memory_margin_pct=dict(type="float"),
        ),
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
