# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """What the KV-cache planner plans from: onprem.vllm.kv_headroom's options, which onprem.vllm.kv_preflight takes
    too (plugins/module_utils/kv_request.py holds their argument spec)."""

    DOCUMENTATION = r"""
options:
  model_config_path:
    description:
      - A C(config.json), a checkpoint directory holding one, an HF cache repo folder (C(models--Org--Name)) or one
        of its snapshots. Multimodal configs are resolved to their C(text_config).
      - When the directory holds safetensors, the weight size comes from C(model.safetensors.index.json) or the
        safetensors headers.
      - One of O(model_config_path) and O(model_config) is given, not both.
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
      - C(auto) - the prediction less the margin (C(fit_margin_bytes), or O(kv_cache_memory_margin_pct) of the budget
        where given), in whole blocks, returned as
        C(kv_cache_memory_bytes) for C(--kv-cache-memory-bytes); tokens and concurrency are those of that pool.
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
        the measured spread of the prediction (C(fit_margin_bytes), C(margin_family)); earlier releases 2 %.
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
"""
