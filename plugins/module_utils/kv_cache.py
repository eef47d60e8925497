# -*- coding: utf-8 -*-
# Copyright: onprem.vllm contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Predict vLLM's KV-cache size on one worker, check vLLM's startup constraints, and suggest fixes.

Pure arithmetic, standard library only (importable by unit tests and the accuracy benchmark without Ansible).

What is exact (vLLM v1 `kv_cache_utils`): bytes per token, page size, block count from a given available memory
(``available // page_size // layers``), the logged token count (``num_blocks * block_size``, the null block included),
max concurrency (``num_blocks / cdiv(max_model_len, block_size)``) and the one-request fit check.
What is estimated: the non-KV memory vLLM measures when it profiles (weights, activation peak of a dummy batch,
non-torch memory, CUDA-graph estimate from 0.21). The constants for those are fitted on public startup logs; see
benchmarks/kv_accuracy.py and docs/kv_headroom.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_version
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import ModelShape

GIB = 1 << 30

# The version this collection's rollout pins by default; callers pass their own.
DEFAULT_VLLM_VERSION = "0.33.0"

KV_CACHE_DTYPE_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

# --- fitted overhead model (benchmarks/kv_accuracy.py --fit prints the fit these come from) -------------------
# Activation peak of vLLM's profile run: a dummy forward of max_num_batched_tokens tokens, then the sampler on
# min(max_num_seqs, tokens) rows of fp32 logits (several logits-sized temporaries live at once).
# Fitted (least squares, base fixed) on the logged activation peaks of the rows marked `fit: true` in
# benchmarks/data/kv_startup_logs.yaml (Llama-3.1-8B on an RTX 3090 at 20k/29k tokens, Qwen2.5-7B 4-bit on an
# RTX 4060); every other row is held out.
ACTIVATION_BASE_BYTES = int(0.10 * GIB)
SAMPLER_LOGITS_COPIES = 6.24
FORWARD_BYTES_PER_TOKEN_WIDTH = 2.28  # bytes per batched token and unit of width (hidden + per-GPU MLP width)
# Non-torch memory growth during profiling (NCCL / custom all-reduce buffers, cuBLAS workspaces), by TP size.
# TP1: median of the fit rows' logged non_torch_memory; TP2-8: the reference's observed ranges (no fit rows yet).
NON_TORCH_BYTES_BY_TP = {1: int(0.35 * GIB), 2: int(0.45 * GIB), 4: int(0.9 * GIB), 8: int(1.4 * GIB)}
# The profiler also subtracts an estimate of the CUDA graphs' pool. vLLM's own log says "CUDA graph memory profiling
# is enabled (default since v0.21.0)" (LMCache#3430 with 0.21.0; a 0.19 dev build says "In v0.19 ... will be enabled
# by default"), so it is counted from 0.21. 0.6 GiB: the logged "Estimated CUDA graph memory" with default capture
# sizes was 0.52 GiB (Qwen3-8B, TP1) and 0.67 GiB (TP4, vllm#39610).
CUDAGRAPH_ESTIMATE_BYTES = int(0.6 * GIB)
CUDAGRAPH_IN_BUDGET_FROM = (0, 21, 0)
UTILIZATION_092_FROM = (0, 20, 0)
# The extensible KV cache (sized from measured memory; default on CUDA and ROCm) and its utilization default of 1.0:
# vLLM 0.34.0's `vllm serve --help` (tests/fixtures/vllm-help); 0.32.0's still says 0.92.
EXTENSIBLE_KV_CACHE_FROM = (0, 34, 0)
# vLLM pads/refines FP8 weight blocks for MoE shards from this version (reference §2: seen in 0.33; the first
# release with it is unverified, so earlier versions are treated as failing).
BLOCK_FP8_PADDING_FROM = (0, 33, 0)
# vLLM's V0 engine (the default before 0.8) pads each MLA cache entry to 256 bytes on CUDA
# (CacheEngine._align_cache, VLLM_CUDA_MEM_ALIGN_KV_CACHE on by default): DeepSeek's 576-element latent takes 640.
MLA_ALIGN_UNTIL = (0, 8, 0)
MLA_ALIGN_BYTES = 256
# Devices of at least 70 GiB that are not A100 get vLLM's larger scheduler defaults (EngineArgs.get_batch_defaults).
LARGE_DEVICE_BYTES = 70 * GIB

# --- vLLM >= 0.26: terms fitted on real startups -------------------------------------------------------------
# Fitted on 8 of the 12 vLLM 0.26.0 startups on one H200 (TP1, 8192 batched tokens, 1024 seqs, dummy weights;
# benchmarks/data/kv-h200-vllm0.26-2026-12-01): q06b-u030-32k, q06b-u090-32k-eager, q30moe-fp8-u090-32k,
# q32b-u090-40k, q8b-u050-32k-eager, q8b-u090-32k-eager, q8b-u090-32k, qwen25-7b-u090-32k. Held out (chosen
# before fitting, scored separately by benchmarks/kv_accuracy.py): mistral-7b-u090-32k, qwen25-7b-awq-u090-32k,
# q8b-u050-32k, q8b-u090-32k-fp8kv. `kv_accuracy.py --fit` reprints every number below. Applied to every version
# from 0.26 on; newer versions than 0.26 were not measured (the plan's notes say so).
CALIBRATED_026_FROM = (0, 26, 0)
CALIBRATED_026_MEASURED = (0, 26)
# Peak activation (vLLM's "GiB for peak activation"): base + bytes per batched token and unit of width (hidden +
# per-GPU MLP width), least squares on the seven dense fit runs, then raised by the largest under-prediction among
# them (Qwen3-8B with a cold torch.compile: 1.29 GiB, 0.45 more than eager) so no fit run is under-predicted.
# The dense runs' peaks do not follow max_num_seqs x vocab (Mistral's 32k vocab peaks above Qwen3-8B's 152k at
# a similar width), so model runner V2 gets no sampler term.
ACTIVATION_026_BASE_BYTES = int(0.567 * GIB)
ACTIVATION_026_BYTES_PER_TOKEN_WIDTH = 3.30
# Model runner V1 (MoE in 0.26) also runs its dummy sampler over max_num_seqs rows of fp32 logits: the copies that
# close q30moe-fp8-u090-32k's 2.68 GiB after the dense terms. One run: fitted, not validated.
ACTIVATION_026_V1_SAMPLER_COPIES = 2.31
# Non-torch memory ("GiB for non-torch memory"): TP1 is the largest of the fit runs (0.22 dense, 0.24 MoE);
# TP2-8 were not measured on 0.26, so they keep the older table's values.
NON_TORCH_026_BYTES_BY_TP = {**NON_TORCH_BYTES_BY_TP, 1: int(0.24 * GIB)}
# CUDA graphs: vLLM 0.26 runs dense models on model runner V2 ("Using V2 Model Runner"), whose profiler does not
# subtract CUDA graphs (profile_cudagraph_memory returns 0 in vllm/v1/worker/gpu/model_runner.py; requested - weight -
# peak - non-torch - available = 0.00 +- 0.01 GiB on every dense run; the graphs, 0.5-1.9 GiB, go in the 1 - util
# headroom). Model runner V1 (MoE and hybrid models) subtracts the estimate of its profile_cudagraph_memory
# (vllm/v1/worker/gpu_model_runner.py), which the planner follows step by step:
#  * the capture sizes (vllm/config/vllm.py _set_cudagraph_sizes): 1, 2, 4, multiples of 8 below 256, multiples of 16
#    from 256, up to min(2 x max_num_seqs, 512, max_num_batched_tokens), plus max_num_batched_tokens if below that;
#  * the default cudagraph_mode FULL_AND_PIECEWISE captures a PIECEWISE graph at every size and a FULL graph at every
#    size up to max_num_seqs (uniform decode batches; vllm/v1/cudagraph_dispatcher.py); the hybrids' backends take
#    FULL graphs of uniform batches too (AttentionCGSupport.UNIFORM_BATCH in vllm/v1/attention/backends/mamba_attn.py
#    and gdn_attn.py; FlashAttention: ALWAYS), so every family runner V1 serves captures the same graphs;
#  * per mode it captures the largest size ("first capture") and the next one ("per graph"), and estimates
#    max(first capture of each mode) + sum over modes of (graphs - 1) x per graph.
# The first capture holds the activations of the largest size in 16 bit (size x (hidden + per-GPU MLP width) x 2: 28
# MiB for Qwen3-8B at 512) or, for a fused MoE, its workspace sized for max_num_batched_tokens (tokens x top-k x max(2 x
# moe_intermediate, hidden) x 2: 256 MiB for Qwen3-30B-A3B at 8192, logged 258), whichever is larger.
# A graph after the first: vLLM takes the free memory the second capture used, at least 1 MiB ("Use at least 1 MiB per
# graph for driver overhead": per_graph = max(mem_samples[1], 1 << 20) in profile_cudagraph_memory). What a capture
# holds is the graph the driver instantiates, a node per kernel launch, so it grows with the layers; the free memory
# moves in whole 2 MiB pages (every logged per-graph figure above the floor is a multiple of 2 MiB). The planner counts
# 128 KiB a layer (the 6 MiB of the 48-layer q30moe-fp8-u090-32k on the H200, "Estimated FULL CUDA graph memory: 258.00
# MiB first-capture + (51-1) x 6.00 MiB per-graph"), rounded up to whole pages, at least the 1 MiB floor. Checked
# against every DEBUG breakdown logged: 36 layers (the 0.21.0 log of Qwen3-8B on an RTX A5000, 0.52 GiB for
# PIECEWISE=51, FULL=35: 28 + 84 x 6 MiB) -> 6 MiB; the compiled H100 startups of 8 and 10 layers
# (benchmarks/data/kv-h100-vllm0.26-compiled-2026-12-05: 1.00 MiB, the floor, and 2.00 MiB for the gated delta net's
# FULL graphs) -> 2 MiB, at most 1 MiB a graph above vLLM's. Before this the planner took 6 MiB for any model, which
# over-reserved 0.49 GiB on those cut models (the Mamba2 and MoE under-claims of that folder). The first capture of a
# hybrid is over-estimated too (Granite 4.0-H tiny: 144 MiB planned, 98 logged; Qwen3-Next: 320, 256): safe, not
# derived further. benchmarks/kv_accuracy.py --cudagraphs prints each log against the estimate.
CUDAGRAPH_PER_GRAPH_LAYER_BYTES = (6 << 20) // 48
CUDAGRAPH_MEMORY_PAGE_BYTES = 2 << 20
CUDAGRAPH_PER_GRAPH_FLOOR_BYTES = 1 << 20
CUDAGRAPH_MAX_CAPTURE_SIZE = 512
# Model runner V2 captures its graphs after the budget is spent, in the 1 - util headroom, and subtracts none while
# profiling. Its pool, "Graph capturing finished in N secs, took X GiB" on the dense H200 runs (51 + 51 graphs):
# 0.50 (Qwen3-0.6B, 28 layers), 0.89 / 0.92 (Qwen2.5-7B / AWQ, 28), 0.98 (Mistral-7B, 32), 1.00 (Qwen3-8B, 36),
# 1.87 GiB (Qwen3-32B, 64): at most 0.33 MiB a graph and layer; the planner counts 0.34 (an upper bound on all six).
V2_GRAPH_BYTES_PER_GRAPH_LAYER = int(0.34 * (1 << 20))
# What the GPU holds besides vLLM's budget before it starts: total - free at startup on the H200 runs ("Free memory
# on device (139.29/139.8 GiB)"): the CUDA context and the driver's reserve.
CUDA_CONTEXT_BYTES = int(0.51 * GIB)

# --- a pinned KV pool (vLLM's --kv-cache-memory-bytes) -------------------------------------------------------
# The flag (CacheConfig.kv_cache_memory_bytes) is absent from vLLM 0.10.1's engine/arg_utils.py and present in
# 0.10.2's. With it the GPU worker skips memory profiling and allocates exactly that many bytes
# (vllm/v1/worker/gpu_worker.py, determine_available_memory), whatever gpu_memory_utilization says.
KV_CACHE_MEMORY_FLAG_FROM = (0, 10, 2)
# The CPU worker honours it from 0.20 (0.19's cpu_worker.py reads only VLLM_CPU_KVCACHE_SPACE); since then
# vllm/platforms/cpu.py turns VLLM_CPU_KVCACHE_SPACE (whole GiB) into kv_cache_memory_bytes, overriding the flag.
CPU_KV_CACHE_MEMORY_FROM = (0, 20, 0)
# Before vLLM 0.26 (the public-log terms) `auto` pins the predicted available KV memory less this share of the
# budget (util x total): twice the worst held-out error of that calibration.
KV_CACHE_MEMORY_MARGIN = 0.02

# --- the margin, per family and mode (vLLM >= 0.26) ----------------------------------------------------------
# From 0.26 on the plan's margin is derived from the measured spread of its prediction: per family of model and mode
# (eager / compiled), the most the predicted available KV memory claimed above what vLLM's profiler gave, over the
# vLLM 0.26.0 startups (benchmarks/data/kv-h200-vllm0.26-2026-12-01 and -families-2026-12-05; config.json weights,
# as a plan without the checkpoint makes it), plus the log's rounding (0.01 GiB), and at least the 150 MiB vLLM
# itself keeps free when it suggests a --kv-cache-memory (redundancy_buffer_memory, vllm/v1/worker/gpu_worker.py).
# The errors are in bytes (activation and graph terms do not scale with the GPU), so the margin is bytes too.
# It is used twice: a plan fits only when its requests fit in the predicted memory less the margin (so no
# deployment vLLM refuses is judged to fit), and `kv_cache_memory: auto` pins the prediction less the margin.
# `kv_accuracy.py --margins` recomputes this table from the logs; a unit test holds it to them.
# (family, mode): (worst over-claim in GiB, rounded up to 0.01; 0 where the plan never claimed more; startups)
OVERCLAIM_026_GIB = {
    ("dense", "eager"): (0.0, 4),
    ("dense", "compiled"): (0.0, 8),
    ("moe", "eager"): (0.0, 1),
    ("moe", "compiled"): (0.02, 1),
    ("sliding window", "eager"): (0.0, 5),
    ("mamba2", "eager"): (0.0, 4),
    ("gated delta net", "eager"): (0.23, 1),
    ("vision-language", "eager"): (0.19, 4),
    # Measured on one H100, not the H200 (benchmarks/data/kv-h100-vllm0.26-compiled-2026-12-05: gemma-3-27b cut to 12
    # layers, 0.9 x 32k and 128k, and the two budget-pinned 128k near misses): see COLD_COMPILE_PEAK below.
    ("sliding window", "compiled"): (1.03, 4),
}
# The one cell whose margin carries a term the planner does not derive. A compiled server's first start compiles its
# graph with torch.compile inside vLLM's profile (vllm/v1/worker/gpu_worker.py determine_available_memory runs
# profile_run under memory_profiling; the first forward compiles: "torch.compile took 18.54 s", then "Cache the graph of
# compile range (1, 8192)", vllm/compilation/backends.py), and the freshly compiled kernels' first run is in the
# profiled peak. On model runner V2 (vllm/v1/worker/gpu/model_runner.py profile_run: the forward of
# max_num_batched_tokens, then the sampler on at most max_num_seqs rows) nothing larger hides it: gemma-3-27b (12
# layers) logged 2.79 GiB of peak activation with a cold cache and 1.24 GiB with a warm one ("Directly load the
# compiled graph(s) ... from the cache"), the same model and batch; Qwen3-8B 1.29 cold, 0.78 warm, 0.84 eager. On
# runner V1 the sampler's peak hides it (cold and warm logged the same peak for Qwen3-VL-30B-A3B: 3.11 GiB). What the
# first run allocates is Inductor's and Triton's (autotuning the generated kernels), which vLLM's source does not size
# and the logs do not break down: the planner's activation term (fitted on dense runs, raised to Qwen3-8B's cold
# compile) is not derived for it, and predicts 1.79 GiB for gemma-3-27b. So the sliding-window compiled margin is the
# measured over-claim (1.02 GiB: 1.00 of it that peak), which is 1.43 % of a 71.26 GiB budget: its prediction misses
# the 0.5 % over-claim target, the margin keeps its verdict and its pinned pool safe. One model on one GPU; a compiled
# sliding-window model with a larger first-run peak is not covered.
COLD_COMPILE_PEAK = {("sliding window", "compiled"): (
    "the profile's peak with a cold torch.compile cache (2.79 GiB logged for gemma-3-27b against 1.79 planned, 1.24 "
    "with a warm cache) is not derived: this margin carries it, measured on one H100")}
MARGIN_LOG_ROUNDING_BYTES = int(0.01 * GIB)
MARGIN_FLOOR_BYTES = 150 << 20
# A family measured in one mode only: compiled = its eager margin + the growth of the compiled profile's peak over
# the eager one measured on the same model (Qwen3-8B: 1.29 GiB compiled with a cold torch.compile cache, 0.84
# eager; the largest such gap of the 0.26 runs); eager = its compiled margin (no CUDA graphs, no compile).
COMPILED_PEAK_GROWTH_BYTES = int(0.45 * GIB)


class PlanInputError(ValueError):
    """Bad input: the message names the field and what to change."""


def parse_version(text: str) -> tuple:
    """'v0.11.0rc1' -> (0, 11, 0) (module_utils/vllm_version); raises PlanInputError for something that is not one."""
    parsed = vllm_version.parse(text)
    if parsed is None:
        raise PlanInputError("vllm_version %r is not a version like 0.11.0" % (text,))
    return parsed


def default_gpu_memory_utilization(version: tuple) -> float:
    """The utilization vLLM uses when none is given (each captured release's `--help`: docs/vllm_releases.md)."""
    if tuple(version) >= EXTENSIBLE_KV_CACHE_FROM:
        raise PlanInputError(
            "vLLM %s sizes its KV cache from measured memory when gpu_memory_utilization is unset (its extensible KV "
            "cache, the default on CUDA: `vllm serve --help` says 1.0 then, 0.92 otherwise), which this planner does "
            "not predict: set onprem_vllm_gpu_memory_utilization (e.g. 0.92) or kv_cache_memory for it"
            % ".".join(map(str, version)))
    return 0.92 if version >= UTILIZATION_092_FROM else 0.9


def default_batch_limits(gpu_memory_bytes: int, gpu_name: str = "") -> tuple:
    """(max_num_batched_tokens, max_num_seqs) that `vllm serve` picks when not given."""
    if gpu_memory_bytes >= LARGE_DEVICE_BYTES and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def kv_dtype_bytes(shape: ModelShape, kv_cache_dtype: str) -> int:
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise PlanInputError("kv_cache_dtype %r is not one of %s" % (kv_cache_dtype, ", ".join(KV_CACHE_DTYPE_BYTES)))
    explicit = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    if explicit:
        return explicit
    # 'auto' follows the model dtype; vLLM serves fp32 checkpoints in 16 bit, so the cache is 16 bit.
    return min(shape.extra.get("dtype_bytes", 2), 2)


def layers_per_stage(num_layers: int, pp: int) -> List[int]:
    """vLLM's get_pp_indices split: even shares, the remainder going to the stages before the last."""
    base = num_layers // pp
    stages = [base] * pp
    for i in range(2, num_layers % pp + 2):
        stages[-i] += 1
    return stages


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    """KV heads a TP rank holds; heads are replicated when there are fewer than TP ranks."""
    if shape.is_mla:
        return 1
    return max(1, shape.num_kv_heads // tp)


def kv_head_size(shape: ModelShape) -> int:
    return shape.kv_lora_rank + shape.qk_rope_head_dim if shape.is_mla else shape.head_dim


def kv_bytes_per_token_per_layer(shape: ModelShape, tp: int, kv_cache_dtype: str,
                                 version: Optional[tuple] = None) -> int:
    # MLA caches one latent vector (no separate K and V); everything else caches K and V.
    k_and_v = 1 if shape.is_mla else 2
    entry = kv_head_size(shape)
    if shape.is_mla and version is not None and version < MLA_ALIGN_UNTIL:
        # V0 aligns in units of the model dtype, whatever the cache dtype (align_to_256bytes(entry, model dtype)).
        align = MLA_ALIGN_BYTES // kv_dtype_bytes(shape, "auto")
        entry = -(-entry // align) * align
    return k_and_v * kv_heads_per_gpu(shape, tp) * entry * kv_dtype_bytes(shape, kv_cache_dtype)


# --- layers of several kinds: vLLM's KV-cache groups (read from vLLM 0.26.0's source) ---------------------------
# vLLM >= 0.26 (vllm/v1/core/kv_cache_utils.py): layers of one spec form a type; each type is cut into groups of
# `group_size` layers (the smallest type's count, or the largest's when that is under 1.5 times it), the last group
# of a type padded. Every group shares one pool of blocks held in group_size tensors, so a block costs
# group_size x page bytes and a request takes blocks in every group.
# The releases whose rules were read, by the kinds a layout holds: 0.26.0 (checked against its startups on an H200,
# benchmarks/data/kv-h200-vllm0.26-families-2026-12-05), 0.32.0 and 0.33.0 (read from their source only: the lent
# GPU's image runs no later vLLM). 0.32/0.33 keep 0.26's sliding-window numbers, hold one block back in the fit check,
# and cache a hybrid's prefixes by default: vLLM's "align" mode, 2 state blocks a request plus a checkpoint block for
# Mamba2 (vllm/model_executor/layers/mamba/mamba_mixer2.py). 0.33's gated delta net also aligns the attention block to
# its prefill backend's checkpoints (FlashInfer's where installed, which was inferred, not read): not predicted there.
# 0.34 sizes the pool from memory measured after warm-up and uses 64-token blocks.
LAYOUT_RULES_READ = {"sliding": ((0, 26), (0, 32), (0, 33)), "mamba2": ((0, 26), (0, 32), (0, 33)),
                     "gated_delta_net": ((0, 26), (0, 32))}
NULL_BLOCK_IN_FIT_CHECK_FROM = (0, 32, 0)
HYBRID_PREFIX_CACHING_FROM = (0, 32, 0)
# Sliding-window layers keep the window plus the tokens in flight: max_concurrent_batches (2: async scheduling, on
# by default, one pipeline stage) x max_num_batched_tokens (vllm/config/vllm.py max_in_flight_tokens).
IN_FLIGHT_BATCHES = 2
# The smallest block the attention kernels take on CUDA (FlashAttention, Triton: MultipleOf(16)): the unit the
# attention block of a hybrid is raised in (Platform._align_hybrid_block_size).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class KvLayout:
    """How vLLM lays the KV cache of one worker out: `tensors` tensors (its group_size), each holding one `page` per
    block; a request takes blocks in every group: cdiv(L, block) in a full-attention group, the window and the
    tokens in flight in a sliding one, one block (its recurrent state) in a Mamba / linear-attention one."""

    block_size: int
    page: int
    tensors: int
    groups: tuple  # (kind, window) per group: ("full", 0), ("sliding", W), ("mamba", 0)
    in_flight_tokens: int = 0
    padding_layers: int = 0
    mamba_page: int = 0
    # blocks the fit check holds back (vLLM 0.32 on: the null block)
    reserved_blocks: int = 0
    # state blocks a request takes in each recurrent-state group (1; 2 or 3 where vLLM caches hybrid prefixes)
    mamba_blocks: int = 1

    @property
    def uniform(self) -> bool:
        return all(kind == "full" for kind, _window in self.groups)

    def blocks_per_request(self, max_len: int) -> int:
        total = 0
        for kind, window in self.groups:
            if kind == "full":
                total += -(-max_len // self.block_size)
            elif kind == "sliding":
                total += -(-min(window - 1 + self.in_flight_tokens, max_len) // self.block_size) + 1
            else:
                total += self.mamba_blocks
        return total

    def needed_bytes(self, max_len: int) -> int:
        return self.tensors * self.page * (self.blocks_per_request(max_len) + self.reserved_blocks)

    def num_blocks(self, available: int) -> int:
        return blocks_for(available, self.page, self.tensors)

    def max_len_fitting(self, available: int, cap: int) -> int:
        """vLLM's estimated maximum model length: the longest length whose request fits in the available memory."""
        return longest_length(lambda length: self.needed_bytes(length) <= available, cap)


def longest_length(fits, cap: int) -> int:
    """The largest length in 1..cap that fits (0 if none), by binary search: what fits at a length fits below it."""
    if cap < 1 or not fits(1):
        return 0
    low, high = 1, cap
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def mamba_page_bytes(shape: ModelShape, tp: int) -> int:
    """Bytes of one layer's recurrent state (conv state + SSM state) on a TP rank, in the model dtype (the SSM state
    in mamba_ssm_dtype_bytes where vLLM overrides it): vllm/model_executor/layers/mamba/mamba_utils.py."""
    dtype = min(shape.extra.get("dtype_bytes", 2), 2)
    ssm_dtype = shape.mamba_ssm_dtype_bytes or dtype
    kind = shape.mamba_state[0]
    if kind == "mamba2":
        d_conv, intermediate, n_groups, d_state, n_heads, head_dim = shape.mamba_state[1:]
        if n_groups % tp:
            n_groups += tp - n_groups  # groups are replicated so that each head shard has its group
        conv = (d_conv - 1) * ((intermediate + 2 * n_groups * d_state) // tp)
        ssm = (n_heads // tp) * head_dim * d_state
    else:  # gated_delta_net
        conv_kernel, k_heads, k_dim, v_heads, v_dim = shape.mamba_state[1:]
        conv = (conv_kernel - 1) * ((2 * k_dim * k_heads + v_dim * v_heads) // tp)
        ssm = (v_heads // tp) * v_dim * k_dim
    return conv * dtype + ssm * ssm_dtype


def kv_layout(shape: ModelShape, tp: int, kv_cache_dtype: str, block_size: int, batched_tokens: int,
              version: Optional[tuple] = None, pp_layers: Optional[int] = None) -> KvLayout:
    """The layout of one worker. Full attention alone is one group of every layer (the uniform formula)."""
    per_token = kv_bytes_per_token_per_layer(shape, tp, kv_cache_dtype, version)
    if not shape.layer_kinds:
        layers = pp_layers or shape.num_layers
        return KvLayout(block_size=block_size, page=per_token * block_size, tensors=layers,
                        groups=(("full", 0),))
    counts: dict = {}
    for kind in shape.layer_kinds:
        if kind != "none":
            counts[kind] = counts.get(kind, 0) + 1
    mamba_page, mamba_blocks = 0, 1
    if "mamba" in counts:
        mamba_page = mamba_page_bytes(shape, tp)
        if version is not None and version >= HYBRID_PREFIX_CACHING_FROM:
            # "align": the running state and the last full block's, plus Mamba2's prefill checkpoint
            mamba_blocks = 3 if shape.mamba_state[0] == "mamba2" else 2
        align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
        block_size = max(block_size, align * -(-mamba_page // (align * per_token)))
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups, padding = [], 0
    for kind, count in counts.items():
        number = -(-count // group_size)
        padding += number * group_size - count
        entry = ("sliding", int(kind.split(":", 1)[1])) if kind.startswith("sliding:") else (kind, 0)
        groups.extend([entry] * number)
    return KvLayout(block_size=block_size, page=per_token * block_size, tensors=group_size, groups=tuple(groups),
                    in_flight_tokens=IN_FLIGHT_BATCHES * batched_tokens, padding_layers=padding,
                    mamba_page=mamba_page, mamba_blocks=mamba_blocks,
                    reserved_blocks=1 if version is not None and version >= NULL_BLOCK_IN_FIT_CHECK_FROM else 0)


def layout_rules_read(shape: ModelShape, version: tuple) -> bool:
    """Whether this planner read vLLM's grouping rules of this release for every kind of layer the model has."""
    kinds = {shape.mamba_state[0] if kind == "mamba" else "sliding"
             for kind in shape.layer_kinds if kind not in ("full", "none")}
    return all(version[:2] in LAYOUT_RULES_READ[kind] for kind in kinds)


@dataclass
class PlanRequest:
    shape: ModelShape
    gpu_memory_bytes: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_model_len: Optional[int] = None
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: Optional[int] = None
    vllm_version: str = DEFAULT_VLLM_VERSION
    weights_bytes_per_gpu: Optional[int] = None
    available_kv_cache_bytes: Optional[int] = None
    min_concurrency: Optional[float] = None
    device: str = "cuda"
    cpu_kv_cache_space_bytes: Optional[int] = None
    enforce_eager: bool = False
    gpu_name: str = ""
    co_located_utilizations: Sequence[float] = ()
    allow_long_max_model_len: bool = False
    # The server's pinned KV pool: None (vLLM profiles), "auto" (pin the plan's prediction) or bytes.
    kv_cache_memory: Optional[object] = None
    # The margin of `auto` as a fraction of the budget; None: the margin of the family and mode (vLLM >= 0.26), or
    # KV_CACHE_MEMORY_MARGIN before.
    kv_cache_memory_margin: Optional[float] = None
    # vLLM's --limit-mm-per-prompt ({modality: count}); None: vLLM's default (999 of each). All zero: a vision-language
    # model runs text-only, its vision tower neither loaded nor profiled.
    limit_mm_per_prompt: Optional[dict] = None
    # The model runner vLLM uses ("v1" or "v2"); None: the one it picks for the model (VLLM_USE_V2_MODEL_RUNNER
    # overrides that choice).
    model_runner: Optional[str] = None


@dataclass
class Plan:
    kv_bytes_per_token: int
    weights_bytes_per_gpu: Optional[int]
    available_kv_cache_bytes: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    fits: bool
    covered: bool
    max_model_len: int
    gpu_memory_utilization: Optional[float]
    budget_bytes: Optional[int]
    activation_peak_bytes: int = 0
    non_torch_bytes: int = 0
    cudagraph_bytes: int = 0
    weights_source: str = ""
    reasons: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    suggestions: dict = field(default_factory=dict)
    # knobs that cannot make it fit on their own, with the number that shows it (for the misfit message)
    cannot_fit: List[str] = field(default_factory=list)
    # The --kv-cache-memory-bytes the server is to be given (None: nothing pinned, vLLM sizes the pool itself)
    kv_cache_memory_bytes: Optional[int] = None
    kv_cache_memory_margin_bytes: int = 0
    # What the fit check keeps back from the prediction (the family and mode's margin; 0 where nothing is predicted)
    fit_margin_bytes: int = 0
    # CUDA graphs captured outside the budget (model runner V2, vLLM >= 0.26), estimated
    cudagraph_outside_bytes: int = 0
    # (family, mode) the margin was taken from
    margin_family: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _require_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError("%s must be an integer, got %r" % (name, value))
    if value < minimum:
        raise PlanInputError("%s must be >= %d, got %d" % (name, minimum, value))
    return value


def validate(req: PlanRequest) -> None:
    _require_int("tensor_parallel_size", req.tensor_parallel_size)
    _require_int("pipeline_parallel_size", req.pipeline_parallel_size)
    _require_int("block_size", req.block_size)
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(req, name) is not None:
            _require_int(name, getattr(req, name))
    if req.gpu_memory_bytes is not None:
        _require_int("gpu_memory_bytes", req.gpu_memory_bytes)
    for name in ("weights_bytes_per_gpu", "available_kv_cache_bytes", "cpu_kv_cache_space_bytes"):
        if getattr(req, name) is not None:
            _require_int(name, getattr(req, name), minimum=0)
    util = req.gpu_memory_utilization
    if util is not None and (isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1):
        raise PlanInputError("gpu_memory_utilization must be in (0, 1], got %r" % (util,))
    for other in req.co_located_utilizations:
        if isinstance(other, bool) or not isinstance(other, (int, float)) or not 0 < other <= 1:
            raise PlanInputError("co_located_utilizations entries must be in (0, 1], got %r" % (other,))
    if req.min_concurrency is not None and (not isinstance(req.min_concurrency, (int, float)) or req.min_concurrency <= 0):
        raise PlanInputError("min_concurrency must be a positive number, got %r" % (req.min_concurrency,))
    if req.kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise PlanInputError("kv_cache_dtype %r is not one of %s" % (req.kv_cache_dtype, ", ".join(KV_CACHE_DTYPE_BYTES)))
    if req.device not in ("cuda", "cpu"):
        raise PlanInputError("device must be cuda or cpu, got %r" % (req.device,))
    version = parse_version(req.vllm_version)
    check_kv_cache_memory(req.kv_cache_memory, version, req.device)
    margin = req.kv_cache_memory_margin
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                               or not 0 <= margin < 1):
        raise PlanInputError("kv_cache_memory_margin must be a fraction in [0, 1), got %r" % (margin,))
    limits = req.limit_mm_per_prompt
    if limits is not None and (not isinstance(limits, dict) or any(
            not isinstance(name, str) or isinstance(count, bool) or not isinstance(count, int) or count < 0
            for name, count in limits.items())):
        raise PlanInputError("limit_mm_per_prompt must map modalities to counts of 0 or more (e.g. {image: 2, "
                             "video: 0}), got %r" % (limits,))
    if req.device == "cuda" and req.gpu_memory_bytes is None and req.available_kv_cache_bytes is None:
        raise PlanInputError("gpu_memory_bytes is required (or gpu_topology facts, or available_kv_cache_bytes) "
                             "for device cuda; for the CPU backend set device: cpu and cpu_kv_cache_space_bytes")


def parse_kv_cache_memory(value) -> Optional[object]:
    """The server setting as the plan takes it: None (unset: '' or None), "auto", or a positive byte count."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return "auto"
        if text.isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError("kv_cache_memory must be empty (vLLM sizes the KV cache), 'auto' (the plan's "
                             "prediction, pinned) or a positive number of bytes, got %r" % (value,))
    return value


def check_kv_cache_memory(setting, version: tuple, device: str) -> None:
    """Refuse a pinned KV pool the pinned vLLM cannot take, naming the release that can."""
    pinned = parse_kv_cache_memory(setting)
    if pinned is None or (device == "cpu" and pinned == "auto"):
        return  # nothing is rendered (on the CPU, VLLM_CPU_KVCACHE_SPACE already pins the pool)
    need = CPU_KV_CACHE_MEMORY_FROM if device == "cpu" else KV_CACHE_MEMORY_FLAG_FROM
    if version < need:
        raise PlanInputError(
            "kv_cache_memory %r needs vLLM %s or later (--kv-cache-memory-bytes%s); the pinned vLLM is %s: unset "
            "vllm_server_kv_cache_memory or pin a newer image" % (
                pinned, ".".join(map(str, need)), " on the CPU backend" if device == "cpu" else "",
                ".".join(map(str, version))))


# --- weights -------------------------------------------------------------------------------------------------

def estimate_parameters(shape: ModelShape) -> dict:
    """Parameter counts of the language model by kind: embeddings, attention, dense MLP, experts."""
    h = shape.hidden_size
    embed = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    if shape.is_mla:
        q_in = h * shape.q_lora_rank + shape.q_lora_rank * shape.num_attention_heads * (
            shape.qk_nope_head_dim + shape.qk_rope_head_dim) if shape.q_lora_rank else (
            h * shape.num_attention_heads * (shape.qk_nope_head_dim + shape.qk_rope_head_dim))
        kv = h * (shape.kv_lora_rank + shape.qk_rope_head_dim) + shape.kv_lora_rank * shape.num_attention_heads * (
            shape.qk_nope_head_dim + shape.v_head_dim)
        attn = q_in + kv + shape.num_attention_heads * shape.v_head_dim * h
    else:
        attn = h * shape.head_dim * (2 * shape.num_attention_heads + 2 * shape.num_kv_heads)
    dense_mlp = 3 * h * shape.intermediate_size
    kinds = shape.layer_kinds
    attn_layers = sum(1 for kind in kinds if kind == "full" or kind.startswith("sliding:")) if kinds else shape.num_layers
    # Nemotron-H: attention and Mamba layers have no MLP; its MLP layers are two matrices (relu2, no gate)
    mlp_layers = kinds.count("none") if shape.model_type == "nemotron_h" else shape.num_layers
    if shape.model_type == "nemotron_h":
        dense_mlp = 2 * h * shape.intermediate_size
    if shape.is_moe:
        moe_layers = mlp_layers - shape.num_dense_layers
        experts = moe_layers * (shape.num_experts * 3 * h * shape.moe_intermediate_size + h * shape.num_experts)
        shared = moe_layers * 3 * h * shape.shared_expert_intermediate_size
        mlp = shape.num_dense_layers * dense_mlp + shared
    else:
        experts = 0
        mlp = mlp_layers * dense_mlp
    return {"embed": embed, "attn": attn_layers * attn, "mlp": mlp, "experts": experts,
            "state": kinds.count("mamba") * recurrent_layer_parameters(shape),
            "vision": shape.vision_parameters}


def recurrent_layer_parameters(shape: ModelShape) -> int:
    """Parameters of one Mamba2 / gated-delta-net layer: input and output projections and the convolution."""
    if not shape.mamba_state:
        return 0
    h = shape.hidden_size
    if shape.mamba_state[0] == "mamba2":
        d_conv, intermediate, n_groups, d_state, n_heads, _head_dim = shape.mamba_state[1:]
        conv_dim = intermediate + 2 * n_groups * d_state
        return h * (intermediate + conv_dim + n_heads) + conv_dim * d_conv + intermediate * h
    conv_kernel, k_heads, k_dim, v_heads, v_dim = shape.mamba_state[1:]
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return h * (conv_dim + v_heads * v_dim + 2 * v_heads) + conv_dim * conv_kernel + v_heads * v_dim * h


def estimate_weights_bytes(shape: ModelShape) -> int:
    """Whole-model weight bytes from the config: quantized linear layers, 16-bit embeddings and lm_head."""
    params = estimate_parameters(shape)
    # the vision tower stays in 16 bit in the quantized checkpoints this planner knows
    unquantized = params["embed"] + params["vision"]
    linear = params["attn"] + params["mlp"] + params["experts"] + params["state"]
    if shape.quant_method == "mxfp4":
        # gpt-oss style: only the experts are MXFP4
        return int(unquantized * 2 + (linear - params["experts"]) * 2 + params["experts"] * shape.weight_bits / 8)
    return int(unquantized * 2 + linear * shape.weight_bits / 8)


def weights_per_gpu(req: PlanRequest, tp: int) -> tuple:
    """(bytes, where the number came from) for one worker of the largest pipeline stage."""
    shape = req.shape
    gpus = tp * req.pipeline_parallel_size
    if req.weights_bytes_per_gpu is not None and tp == req.tensor_parallel_size:
        return req.weights_bytes_per_gpu, "given"
    if shape.checkpoint_bytes:
        total, source = shape.checkpoint_bytes, "safetensors"
    else:
        total, source = estimate_weights_bytes(shape), "estimated from config.json"
    if shape.vision_parameters and not vision_tower_loaded(req):
        total -= 2 * shape.vision_parameters  # text-only: the 16-bit vision tower stays on disk
        source += ", without the vision tower"
    per_gpu = total / gpus
    if not shape.is_mla and shape.num_kv_heads < tp:
        # K/V projections are replicated on each rank instead of split
        kv_proj = 2 * shape.hidden_size * shape.num_kv_heads * shape.head_dim * shape.num_layers
        per_gpu += kv_proj * (tp // shape.num_kv_heads - 1) / gpus * shape.weight_bits / 8
    return int(per_gpu), source


# --- non-KV memory of the profile run ------------------------------------------------------------------------

def mlp_width_per_gpu(shape: ModelShape, tp: int, expert_parallel: bool) -> float:
    """Width of the widest per-token MLP activation on one rank (gate+up output, or the fused-MoE caches)."""
    if shape.is_moe:
        moe_tp = 1 if expert_parallel else tp
        return shape.num_experts_per_tok * (2.0 * shape.moe_intermediate_size / moe_tp + shape.hidden_size)
    if shape.model_type == "nemotron_h":
        return 1.0 * shape.intermediate_size / tp  # relu2: one up projection, no gate
    return 2.0 * shape.intermediate_size / tp


def activation_peak_bytes(shape: ModelShape, tp: int, batched_tokens: int, num_seqs: int,
                          expert_parallel: bool = False, last_stage: bool = True) -> int:
    rows = min(num_seqs, batched_tokens)
    sampler = SAMPLER_LOGITS_COPIES * rows * shape.vocab_size * 4 if last_stage else 0
    width = shape.hidden_size + mlp_width_per_gpu(shape, tp, expert_parallel)
    forward = FORWARD_BYTES_PER_TOKEN_WIDTH * batched_tokens * width
    return int(ACTIVATION_BASE_BYTES + sampler + forward)


def non_torch_bytes(tp: int, pp: int, table: Optional[dict] = None) -> int:
    table = table or NON_TORCH_BYTES_BY_TP
    world = tp * pp
    known = sorted(table)
    if world in table:
        return table[world]
    below = max([k for k in known if k <= world] or [known[0]])
    return table[below]


def uses_model_runner_v1(shape: ModelShape, version: tuple) -> bool:
    """Whether vLLM profiles this model with model runner V1 (CUDA graphs inside the budget) rather than V2.

    Seen in 0.26.0: every dense model (BF16, AWQ, FP8 KV; Qwen2.5/Qwen3/Mistral) logs "Using V2 Model Runner",
    the block-FP8 MoE model does not; vllm/config/vllm.py keeps V1 for MoE and hybrid (recurrent-state) models.
    Before 0.26 there is only V1."""
    return version < CALIBRATED_026_FROM or shape.is_moe or "mamba" in shape.layer_kinds


def runner_v1(req: PlanRequest, version: tuple) -> bool:
    if req.model_runner:
        return req.model_runner == "v1"
    return uses_model_runner_v1(req.shape, version)


# Model runner V2 profiles no vision encoder in 0.26 (its MM budget is a TODO there) and does in 0.32 and 0.33, as V1
# does (vllm/v1/worker/gpu/model_runner.py profile_run, as read in those releases).
ENCODER_PROFILED_BY_V2_FROM = (0, 32, 0)
# Modalities a vision tower serves when the planner does not know the family's processor.
DEFAULT_MODALITIES = ("image",)
# vLLM's default --limit-mm-per-prompt for a modality it is not given (vllm/config/multimodal.py).
DEFAULT_MM_LIMIT = 999


def served_modalities(shape: ModelShape) -> tuple:
    """(modality, most tokens an item; 0 where not known) of every modality the model's vision tower serves."""
    return shape.vision_tokens_per_item or tuple((name, 0) for name in DEFAULT_MODALITIES)


def active_modalities(req: PlanRequest) -> List[tuple]:
    """(modality, most tokens an item) of the modalities whose limit is above 0 (vLLM's default limit is 999)."""
    limits = req.limit_mm_per_prompt or {}
    return [(name, tokens) for name, tokens in served_modalities(req.shape)
            if int(limits.get(name, DEFAULT_MM_LIMIT)) > 0]


def encoder_profiled(req: PlanRequest, version: tuple) -> bool:
    """Whether vLLM's profile run holds a vision encoder's outputs (runner V1, or V2 from 0.32), from 0.26 on."""
    return (version >= CALIBRATED_026_FROM and vision_tower_loaded(req)
            and (runner_v1(req, version) or version >= ENCODER_PROFILED_BY_V2_FROM))


def vision_tower_loaded(req: PlanRequest) -> bool:
    """Whether vLLM loads the vision encoder: a vision-language model unless every modality it serves is limited to 0
    (then it runs text-only and skips the tower)."""
    return req.shape.vision_parameters > 0 and bool(active_modalities(req))


def encoder_profile_bytes(req: PlanRequest, batched_tokens: int) -> Optional[int]:
    """What model runner V1's profile holds for the vision encoder while it runs the language model: the encoder's
    outputs for the dummy batch (items of the modality with the most tokens, as many as the encoder budget
    max(max_num_batched_tokens, that item) holds), at the width it hands the language model, 16-bit. None where the
    family's tokens per item are not known (vllm/v1/worker/gpu_model_runner.py profile_run,
    vllm/multimodal/encoder_budget.py)."""
    active = active_modalities(req)
    if not active or not all(tokens for _name, tokens in active):
        return None
    tokens = max(tokens for _name, tokens in active)
    items = max(batched_tokens, tokens) // tokens
    return items * tokens * req.shape.vision_output_width * 2


def activation_peak_bytes_026(shape: ModelShape, tp: int, batched_tokens: int, num_seqs: int,
                              expert_parallel: bool = False, runner_v1: bool = False) -> int:
    """vLLM >= 0.26 peak activation of the profile run (see ACTIVATION_026_* for the runs it was fitted on)."""
    width = shape.hidden_size + mlp_width_per_gpu(shape, tp, expert_parallel)
    forward = ACTIVATION_026_BYTES_PER_TOKEN_WIDTH * batched_tokens * width
    sampler = 0.0
    if runner_v1:
        sampler = ACTIVATION_026_V1_SAMPLER_COPIES * min(num_seqs, batched_tokens) * shape.vocab_size * 4
    return int(ACTIVATION_026_BASE_BYTES + forward + sampler)


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> List[int]:
    """vLLM's default CUDA-graph capture sizes (vllm/config/vllm.py _set_cudagraph_sizes, no speculative decoding)."""
    largest = min(max_num_seqs * 2, CUDAGRAPH_MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def cudagraph_counts(max_num_seqs: int, max_num_batched_tokens: int) -> dict:
    """Graphs model runner V1 captures in the default FULL_AND_PIECEWISE mode: {mode: (graphs, largest size)}."""
    sizes = cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens)
    full = [size for size in sizes if size <= max_num_seqs]
    counts = {"PIECEWISE": (len(sizes), sizes[-1] if sizes else 0)}
    if full:
        counts["FULL"] = (len(full), full[-1])
    return counts


def cudagraph_first_capture_bytes(shape: ModelShape, tp: int, size: int, batched_tokens: int,
                                  expert_parallel: bool = False) -> int:
    """The graph pool's first capture: the activations of `size` tokens, or a fused MoE's workspace."""
    activations = size * (shape.hidden_size + mlp_width_per_gpu(shape, tp, expert_parallel)) * 2
    workspace = 0
    if shape.is_moe:
        moe_tp = 1 if expert_parallel else tp
        workspace = (batched_tokens * shape.num_experts_per_tok
                     * max(2 * shape.moe_intermediate_size // moe_tp, shape.hidden_size) * 2)
    return int(max(activations, workspace))


def cudagraph_per_graph_bytes(layers: int) -> int:
    """What runner V1's estimate counts for a graph after the first: CUDAGRAPH_PER_GRAPH_LAYER_BYTES a layer in whole
    CUDAGRAPH_MEMORY_PAGE_BYTES pages, at least vLLM's CUDAGRAPH_PER_GRAPH_FLOOR_BYTES."""
    pages = -(-layers * CUDAGRAPH_PER_GRAPH_LAYER_BYTES // CUDAGRAPH_MEMORY_PAGE_BYTES)
    return max(pages * CUDAGRAPH_MEMORY_PAGE_BYTES, CUDAGRAPH_PER_GRAPH_FLOOR_BYTES)


def cudagraph_estimate_bytes(shape: ModelShape, tp: int, batched_tokens: int, num_seqs: int,
                             expert_parallel: bool = False, layers: Optional[int] = None) -> int:
    """Model runner V1's "Estimated CUDA graph memory" (profile_cudagraph_memory): max of the modes' first
    captures plus each mode's further graphs at cudagraph_per_graph_bytes of the worker's layers."""
    counts = cudagraph_counts(num_seqs, batched_tokens)
    first = max(cudagraph_first_capture_bytes(shape, tp, largest, batched_tokens, expert_parallel)
                for _graphs, largest in counts.values())
    per_graph = cudagraph_per_graph_bytes(shape.num_layers if layers is None else layers)
    return first + sum(graphs - 1 for graphs, _largest in counts.values()) * per_graph


def cudagraph_in_budget_bytes(shape: ModelShape, version: tuple, enforce_eager: bool,
                              runner_is_v1: Optional[bool] = None, tp: int = 1, batched_tokens: int = 8192,
                              num_seqs: int = 1024, expert_parallel: bool = False,
                              layers: Optional[int] = None) -> int:
    """The CUDA-graph estimate vLLM subtracts from the budget while profiling (0 where graphs live outside it);
    `layers`: the worker's (its pipeline stage's), the model's when None."""
    if enforce_eager or version < CUDAGRAPH_IN_BUDGET_FROM:
        return 0
    if version < CALIBRATED_026_FROM:
        return CUDAGRAPH_ESTIMATE_BYTES
    if runner_is_v1 is None:
        runner_is_v1 = uses_model_runner_v1(shape, version)
    if not runner_is_v1:
        return 0
    return cudagraph_estimate_bytes(shape, tp, batched_tokens, num_seqs, expert_parallel, layers)


def plan_family(req: PlanRequest) -> str:
    """The family the margin is taken from: what vLLM runs (a vision-language model served text-only runs its
    language model alone)."""
    shape = req.shape
    if vision_tower_loaded(req):
        return "vision-language"
    if "mamba" in shape.layer_kinds:
        return "gated delta net" if shape.mamba_state and shape.mamba_state[0] == "gated_delta_net" else "mamba2"
    if any(kind.startswith("sliding:") for kind in shape.layer_kinds):
        return "sliding window"
    return "moe" if shape.is_moe else "dense"


def _measured_margin(family: str, mode: str) -> Optional[tuple]:
    if (family, mode) not in OVERCLAIM_026_GIB:
        return None
    worst, runs = OVERCLAIM_026_GIB[(family, mode)]
    return max(int(worst * GIB) + MARGIN_LOG_ROUNDING_BYTES, MARGIN_FLOOR_BYTES), worst, runs


def kv_margin(req: PlanRequest) -> tuple:
    """(bytes, family, how it was derived) of the margin of a vLLM >= 0.26 plan on a GPU (OVERCLAIM_026_GIB)."""
    family = plan_family(req)
    mode = "eager" if req.enforce_eager else "compiled"
    measured = _measured_margin(family, mode)
    if measured:
        margin, worst, runs = measured
        how = ("the most the plan claimed above vLLM's profile over %d %s %s startup%s (vLLM 0.26.0), %.2f GiB, + "
               "0.01 GiB of log rounding, at least vLLM's own 150 MiB" % (runs, mode, family,
                                                                          "" if runs == 1 else "s", worst))
        if (family, mode) in COLD_COMPILE_PEAK:
            how += "; " + COLD_COMPILE_PEAK[(family, mode)]
    else:
        other = "compiled" if mode == "eager" else "eager"
        other_margin = _measured_margin(family, other)
        if other_margin is None:  # every family is measured in one mode at least; kept for a new family
            other_margin = (MARGIN_FLOOR_BYTES,)
        if mode == "compiled":
            margin = other_margin[0] + COMPILED_PEAK_GROWTH_BYTES
            how = ("%s startups not measured: the eager margin %s GiB + %s GiB, the compiled profile's peak growth "
                   "over eager measured on Qwen3-8B" % (mode, _gib(other_margin[0]), _gib(COMPILED_PEAK_GROWTH_BYTES)))
        else:
            margin = other_margin[0]
            how = "eager startups not measured: the compiled margin (an eager profile has no graphs or compile)"
    return margin, "%s, %s" % (family, mode), how


def cudagraph_outside_budget_bytes(shape: ModelShape, version: tuple, enforce_eager: bool, runner_is_v1: bool,
                                   layers: int, batched_tokens: int, num_seqs: int) -> int:
    """The CUDA graphs model runner V2 (vLLM >= 0.26) captures outside the budget: graphs x layers x
    V2_GRAPH_BYTES_PER_GRAPH_LAYER (0 for runner V1, eager servers and older releases)."""
    if enforce_eager or runner_is_v1 or version < CALIBRATED_026_FROM:
        return 0
    graphs = sum(count for count, _largest in cudagraph_counts(num_seqs, batched_tokens).values())
    return graphs * layers * V2_GRAPH_BYTES_PER_GRAPH_LAYER


def utilization_ceiling(gpu_memory_bytes: int, outside: int) -> float:
    """The highest utilization that leaves the CUDA context and the graphs captured outside the budget their room,
    in hundredths, at most MAX_SUGGESTED_UTILIZATION."""
    room = (gpu_memory_bytes - CUDA_CONTEXT_BYTES - outside) / gpu_memory_bytes
    return min(MAX_SUGGESTED_UTILIZATION, math.floor(room * 100) / 100.0)


# --- the plan ------------------------------------------------------------------------------------------------

def blocks_for(available: int, page_size_per_layer: int, layers: int) -> int:
    """vLLM get_num_blocks: floor(available / page_size / layers), never negative."""
    if available <= 0 or layers <= 0:
        return 0
    return max(int(available // page_size_per_layer // layers), 0)


def _gib(value: float) -> str:
    return "%.2f" % (value / GIB)


def _non_kv_bytes(req: PlanRequest, tp: int, version: tuple) -> dict:
    shape = req.shape
    gpu_bytes = req.gpu_memory_bytes or 0
    default_tokens, default_seqs = default_batch_limits(gpu_bytes, req.gpu_name)
    tokens = req.max_num_batched_tokens or default_tokens
    seqs = req.max_num_seqs or default_seqs
    weights, source = weights_per_gpu(req, tp)
    v1 = runner_v1(req, version)
    if version >= CALIBRATED_026_FROM:
        act = activation_peak_bytes_026(shape, tp, tokens, seqs, req.enable_expert_parallel, v1)
        non_torch = non_torch_bytes(tp, req.pipeline_parallel_size, NON_TORCH_026_BYTES_BY_TP)
        if source != "given":  # what vLLM logged as "Model loading took" holds them already
            # the rotary embeddings' cos/sin caches, made at load on every GPU (model_config.rope_cache_elements)
            weights += shape.rope_cache_elements * shape.extra.get("dtype_bytes", 2)
        if vision_tower_loaded(req):
            # Qwen3-VL's deepstack input buffers (max_num_batched_tokens x text width each) are made at load
            weights += shape.deepstack_levels * tokens * shape.hidden_size * 2
            if encoder_profiled(req, version):
                act += encoder_profile_bytes(req, tokens) or 0
    else:
        act = activation_peak_bytes(shape, tp, tokens, seqs, req.enable_expert_parallel)
        non_torch = non_torch_bytes(tp, req.pipeline_parallel_size)
    stage_layers = max(layers_per_stage(shape.num_layers, req.pipeline_parallel_size))
    cudagraph = cudagraph_in_budget_bytes(shape, version, req.enforce_eager, v1, tp, tokens, seqs,
                                          req.enable_expert_parallel, stage_layers)
    outside = cudagraph_outside_budget_bytes(shape, version, req.enforce_eager, v1, stage_layers, tokens, seqs)
    return {"weights": weights, "weights_source": source, "activation": act, "non_torch": non_torch,
            "cudagraph": cudagraph, "cudagraph_outside": outside, "batched_tokens": tokens, "num_seqs": seqs}


def _available_for(req: PlanRequest, tp: int, util: float, version: tuple) -> tuple:
    """(available KV bytes, non-KV breakdown) for a GPU worker."""
    parts = _non_kv_bytes(req, tp, version)
    requested = math.ceil(req.gpu_memory_bytes * util)
    available = requested - parts["weights"] - parts["activation"] - parts["non_torch"] - parts["cudagraph"]
    return int(available), parts


def constraint_reasons(req: PlanRequest, tp: int, version: tuple) -> List[str]:
    """Startup failures that do not depend on memory, in vLLM's wording where it has one."""
    shape = req.shape
    reasons = []
    if shape.num_attention_heads % tp:
        reasons.append("Total number of attention heads (%d) must be divisible by tensor parallel size (%d)."
                       % (shape.num_attention_heads, tp))
    if not shape.is_mla:
        kv = shape.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            reasons.append("Total number of KV heads (%d) must be divisible by tensor parallel size (%d) or divide "
                           "it (vLLM asserts this when it builds QKVParallelLinear)." % (kv, tp))
    if shape.num_layers < req.pipeline_parallel_size:
        reasons.append("pipeline_parallel_size (%d) is larger than the number of layers (%d)."
                       % (req.pipeline_parallel_size, shape.num_layers))
    block = shape.weight_block_size
    if block and len(block) == 2 and version < BLOCK_FP8_PADDING_FROM:
        block_n = int(block[0])
        if shape.is_moe and not req.enable_expert_parallel:
            if shape.moe_intermediate_size % tp or (shape.moe_intermediate_size // tp) % block_n:
                reasons.append("The output_size of gate's and up's weight = %d is not divisible by weight "
                               "quantization block_n = %d. (moe_intermediate_size %d / TP %d; use a TP that keeps it "
                               "a multiple of %d, or --enable-expert-parallel)"
                               % (shape.moe_intermediate_size // tp, block_n, shape.moe_intermediate_size, tp, block_n))
        dense_width = shape.intermediate_size if (not shape.is_moe or shape.num_dense_layers) else 0
        if dense_width and (dense_width % tp or (dense_width // tp) % block_n):
            reasons.append("Weight output_partition_size = %d is not divisible by weight quantization block_n = %d."
                           % (dense_width // tp, block_n))
    return reasons


def _layout_for(req: PlanRequest, tp: int, kv_cache_dtype: str, version: tuple, layers: int) -> KvLayout:
    tokens = req.max_num_batched_tokens or default_batch_limits(req.gpu_memory_bytes or 0, req.gpu_name)[0]
    return kv_layout(req.shape, tp, kv_cache_dtype, req.block_size, tokens, version, layers)


def layer_kinds_text(shape: ModelShape) -> str:
    counts: dict = {}
    for kind in shape.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    names = {"full": "full attention", "mamba": "recurrent state", "none": "no cache"}
    return ", ".join("%d %s" % (n, names.get(k, k.replace("sliding:", "sliding window ")))
                     for k, n in sorted(counts.items()))


def layout_text(layout: KvLayout, shape: ModelShape) -> str:
    """The layout as the plan's note: groups, block, page and what a request takes."""
    kinds = {}
    names = {"full": "full attention", "mamba": "recurrent state"}
    for kind, window in layout.groups:
        key = "sliding window %d" % window if kind == "sliding" else names[kind]
        kinds[key] = kinds.get(key, 0) + 1
    text = ("layers of several kinds (%s): %d KV-cache groups of %d layers (%s)%s, one pool of blocks of %d tokens, "
            "%d bytes a layer" % (layer_kinds_text(shape), len(layout.groups), layout.tensors,
                                  ", ".join("%d %s" % (n, k) for k, n in kinds.items()),
                                  " with %d padding layers" % layout.padding_layers if layout.padding_layers else "",
                                  layout.block_size, layout.page))
    if layout.mamba_page:
        text += "; the attention block is raised so one page holds a layer's %d-byte recurrent state" % layout.mamba_page
    if any(kind == "sliding" for kind, _window in layout.groups):
        text += ("; a sliding-window layer keeps its window plus %d tokens in flight (2 x max_num_batched_tokens)"
                 % layout.in_flight_tokens)
    return text


def plan(req: PlanRequest) -> Plan:
    validate(req)
    shape = req.shape
    version = parse_version(req.vllm_version)
    tp, pp, bs = req.tensor_parallel_size, req.pipeline_parallel_size, req.block_size
    max_len = req.max_model_len or shape.derived_max_model_len
    layers = max(layers_per_stage(shape.num_layers, pp))
    per_layer = kv_bytes_per_token_per_layer(shape, tp, req.kv_cache_dtype, version)
    reasons: List[str] = []
    notes: List[str] = []
    unpredicted = shape.non_uniform_reason
    if shape.layer_kinds and not unpredicted:
        if not layout_rules_read(shape, version):
            unpredicted = ("its layers are of several kinds (%s), and how vLLM %s groups them was not read (this "
                           "planner read the rules of 0.26, 0.32 and 0.33, of 0.26 and 0.32 for a gated delta net)"
                           % (layer_kinds_text(shape), ".".join(map(str, version))))
        elif pp > 1:
            unpredicted = ("its layers are of several kinds (%s), grouped across pipeline stages: predicted for "
                           "pipeline_parallel_size 1 only" % layer_kinds_text(shape))
    if (not unpredicted and req.device == "cuda" and encoder_profiled(req, version)
            and encoder_profile_bytes(req, 1) is None):
        unpredicted = ("vLLM profiles its vision encoder with the largest multimodal item, and the tokens of one "
                       "item of model_type %s are not known to the planner (limit_mm_per_prompt with every "
                       "modality 0 serves it text-only)" % shape.model_type)
    covered = not unpredicted
    pinned = parse_kv_cache_memory(req.kv_cache_memory)
    if not covered and pinned is not None and req.device == "cuda":
        notes.append("Not predicted: %s. kv_cache_memory pins the pool, so vLLM allocates exactly it and makes its "
                     "own blocks of it; no KV tokens or concurrency are claimed." % unpredicted)
    elif not covered:
        reasons.append("Not predicted: %s. No KV size is claimed; kv_cache_memory: auto pins the predicted pool "
                       "instead, or check vLLM's own log, or set fail_on_misfit: false to roll out unchecked."
                       % unpredicted)
    layout = _layout_for(req, tp, req.kv_cache_dtype, version, layers)
    page = layout.page
    if not layout.uniform:
        notes.append(layout_text(layout, shape))

    util = None
    budget = None
    weights = None
    parts = {"activation": 0, "non_torch": 0, "cudagraph": 0, "weights_source": ""}
    pool = None
    margin_bytes = 0
    fit_margin, margin_family, margin_how = 0, "", ""
    if req.available_kv_cache_bytes is not None:
        available = req.available_kv_cache_bytes
        notes.append("available_kv_cache_bytes given: only the block arithmetic ran (like --kv-cache-memory)")
    elif req.device == "cpu":
        if isinstance(pinned, int):
            available = pool = pinned
            notes.append("CPU backend: KV space is --kv-cache-memory-bytes %d (%s GiB; VLLM_CPU_KVCACHE_SPACE "
                         "left unset, it would override the flag)" % (pinned, _gib(pinned)))
        else:
            available = req.cpu_kv_cache_space_bytes if req.cpu_kv_cache_space_bytes is not None else 4 * GIB
            notes.append("CPU backend: KV space is VLLM_CPU_KVCACHE_SPACE (%s GiB)%s" % (
                _gib(available), ", which already pins the pool: kv_cache_memory auto renders nothing more"
                if pinned == "auto" else ""))
    else:
        util = req.gpu_memory_utilization or default_gpu_memory_utilization(version)
        budget = math.ceil(req.gpu_memory_bytes * util)
        available, parts = _available_for(req, tp, util, version)
        weights = parts["weights"]
        if version >= CALIBRATED_026_FROM:
            fit_margin, margin_family, margin_how = kv_margin(req)
        if pinned is not None:
            available, pool, margin_bytes = _pinned_pool(req, pinned, available, budget, page, layout.tensors, parts,
                                                         reasons, notes, fit_margin, margin_family, margin_how)
            fit_margin = 0  # vLLM gets exactly the pool: the check is exact
            if isinstance(pinned, int):
                budget = None  # vLLM ignores the utilization then: no utilization can be suggested
        elif fit_margin and covered:
            notes.append("margin %s GiB (%s): %s. It fits only what fits in the predicted %s GiB less the margin"
                         % (_gib(fit_margin), margin_family, margin_how, _gib(available)))
        if version[:2] > CALIBRATED_026_MEASURED:
            notes.append("non-KV terms calibrated on vLLM 0.26.0 startups; %s was not measured"
                         % req.vllm_version)
        if weights > req.gpu_memory_bytes:
            reasons.append("Weights need %s GiB per GPU, more than the GPU's %s GiB: loading fails with CUDA out of "
                           "memory." % (_gib(weights), _gib(req.gpu_memory_bytes)))
        outside = parts.get("cudagraph_outside", 0)
        if outside and budget is not None and budget + CUDA_CONTEXT_BYTES + outside > req.gpu_memory_bytes:
            reasons.append("gpu_memory_utilization %.2f leaves %s GiB of the GPU's %s GiB beside the budget and the "
                           "%s GiB CUDA context, less than the estimated %s GiB of CUDA graphs vLLM's model runner V2 "
                           "captures outside the budget: graph capture runs out of memory. At most %.2f fits (or "
                           "enforce_eager)." % (
                               util, _gib(req.gpu_memory_bytes - budget - CUDA_CONTEXT_BYTES),
                               _gib(req.gpu_memory_bytes), _gib(CUDA_CONTEXT_BYTES), _gib(outside),
                               utilization_ceiling(req.gpu_memory_bytes, outside)))
        elif outside:
            notes.append("CUDA graphs outside the budget (model runner V2): an estimated %s GiB, which the %s GiB "
                         "beside the budget holds" % (_gib(outside), _gib(req.gpu_memory_bytes - (budget or 0))))
    if req.weights_bytes_per_gpu is not None and weights is None:
        weights = req.weights_bytes_per_gpu

    num_blocks = layout.num_blocks(available)
    blocks_per_request = layout.blocks_per_request(max_len)
    max_concurrency = num_blocks / blocks_per_request if blocks_per_request else 0.0
    # vLLM's "GPU KV cache size": the tokens of that many requests of max_model_len (whole blocks when uniform)
    tokens = num_blocks * bs if layout.uniform else int(max_concurrency * max_len)

    reasons.extend(constraint_reasons(req, tp, version))
    if max_len > shape.derived_max_model_len and not req.allow_long_max_model_len:
        reasons.append("User-specified max_model_len (%d) is greater than the derived max_model_len "
                       "(max_position_embeddings=%d in model's config.json). To allow overriding this maximum, set "
                       "the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (only with rope scaling that supports it)."
                       % (max_len, shape.derived_max_model_len))
    for other in req.co_located_utilizations:
        if util is not None and util + other >= 1.0:
            reasons.append("gpu_memory_utilization %.2f plus %.2f of another instance on the same GPU is %.2f >= 1.0: "
                           "the second to start fails with 'Free memory on device ... is less than desired GPU memory "
                           "utilization'." % (util, other, util + other))
    needed = layout.needed_bytes(max_len)
    checked = available - fit_margin
    fits_one = checked > 0 and needed <= checked
    memory_short = not fits_one
    if covered:
        if available <= 0:
            reasons.append("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                           "initializing the engine. (predicted %s GiB left for KV)" % _gib(available))
        elif needed > available:
            estimate = layout.max_len_fitting(checked, max_len)
            reasons.append("To serve at least one request with the model's max seq len (%d), (%s GiB KV cache is "
                           "needed, which is larger than the available KV cache memory (%s GiB). Based on the "
                           "available memory, the estimated maximum model length is %d%s. Try increasing "
                           "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
                           % (max_len, _gib(needed), _gib(available), estimate,
                              " (less the planner's margin)" if fit_margin else ""))
        elif not fits_one:
            estimate = layout.max_len_fitting(checked, max_len)
            reasons.append("One request of max_model_len %d needs %s GiB of KV cache: the predicted %s GiB holds it, "
                           "but not less the planner's margin of %s GiB (%s), so vLLM may refuse it (\"larger than "
                           "the available KV cache memory\"). Within the margin the longest max_model_len is %d."
                           % (max_len, _gib(needed), _gib(available), _gib(fit_margin), margin_family, estimate))
        checked_concurrency = (layout.num_blocks(checked) / blocks_per_request if blocks_per_request
                               else 0.0) if fit_margin else max_concurrency
        if req.min_concurrency and fits_one and checked_concurrency < req.min_concurrency:
            memory_short = True
            reasons.append("Maximum concurrency for %d tokens per request is %.2fx%s, below min_concurrency %s."
                           % (max_len, max_concurrency, " (%.2fx less the planner's margin)" % checked_concurrency
                              if fit_margin else "", req.min_concurrency))

    result = Plan(
        kv_bytes_per_token=per_layer * (layers if layout.uniform else shape.layer_kinds.count("full")),
        weights_bytes_per_gpu=weights,
        available_kv_cache_bytes=int(available),
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=round(max_concurrency, 2),
        fits=not reasons,
        covered=covered,
        max_model_len=max_len,
        gpu_memory_utilization=util,
        budget_bytes=budget,
        activation_peak_bytes=parts["activation"],
        non_torch_bytes=parts["non_torch"],
        cudagraph_bytes=parts["cudagraph"],
        weights_source=parts["weights_source"],
        reasons=reasons,
        notes=notes,
        kv_cache_memory_bytes=pool,
        kv_cache_memory_margin_bytes=margin_bytes,
        fit_margin_bytes=fit_margin,
        cudagraph_outside_bytes=parts.get("cudagraph_outside", 0),
        margin_family=margin_family,
    )
    if covered:
        result.suggestions = suggest(req, result, version, layout, memory_short)
    return result


def pinned_auto_bytes(available: int, budget: int, margin: float, page_size_per_layer: int, layers: int) -> tuple:
    """(pool, margin bytes) for kv_cache_memory auto: the predicted available memory less margin x budget, rounded
    down to whole blocks of every layer, so the pinned bytes are exactly the blocks vLLM will make of them."""
    margin_bytes = math.ceil(margin * budget)
    pool = blocks_for(available - margin_bytes, page_size_per_layer, layers) * page_size_per_layer * layers
    return pool, margin_bytes


def _pinned_pool(req: PlanRequest, pinned, available: int, budget: int, page: int, layers: int, parts: dict,
                 reasons: List[str], notes: List[str], family_margin: int = 0, margin_family: str = "",
                 margin_how: str = "") -> tuple:
    """(KV bytes the plan uses, the pool to render, the margin) for a pinned pool on a GPU."""
    non_kv = budget - available  # weights, activation peak, non-torch, CUDA graphs in the budget (estimated)
    if pinned == "auto":
        if req.kv_cache_memory_margin is not None or not family_margin:
            fraction = KV_CACHE_MEMORY_MARGIN if req.kv_cache_memory_margin is None else req.kv_cache_memory_margin
            pool, margin_bytes = pinned_auto_bytes(available, budget, fraction, page, layers)
            why = "a %g %% margin of the %s GiB budget" % (100 * fraction, _gib(budget))
        else:
            pool = blocks_for(available - family_margin, page, layers) * page * layers
            margin_bytes = family_margin
            why = "the %s margin of %s GiB (%.2f %% of the %s GiB budget: %s)" % (
                margin_family, _gib(family_margin), 100.0 * family_margin / budget, _gib(budget), margin_how)
        notes.append("kv_cache_memory auto: --kv-cache-memory-bytes %d (%s GiB) = the predicted %s GiB less %s, in "
                     "whole blocks" % (pool, _gib(pool), _gib(available), why))
        return pool, pool, margin_bytes
    outside = parts.get("cudagraph_outside", 0)
    non_kv += outside  # runner V2's graphs, captured besides the pool
    ceiling = min(int(MAX_SUGGESTED_UTILIZATION * req.gpu_memory_bytes),
                  req.gpu_memory_bytes - CUDA_CONTEXT_BYTES) - non_kv
    notes.append("kv_cache_memory %d bytes (%s GiB): vLLM skips profiling and ignores gpu_memory_utilization; the "
                 "server needs an estimated %s GiB besides (weights %s, activation %s, non-torch %s, CUDA graphs %s)"
                 % (pinned, _gib(pinned), _gib(non_kv), _gib(parts["weights"]), _gib(parts["activation"]),
                    _gib(parts["non_torch"]), _gib(parts["cudagraph"] + outside)))
    if pinned > ceiling:
        reasons.append("kv_cache_memory %d bytes (%s GiB) and the estimated %s GiB the server needs besides exceed "
                       "%.2f of the GPU's %s GiB (less its %s GiB CUDA context): vLLM allocates the pool without "
                       "profiling and runs out of memory at the activation peak or in graph capture. At most %d bytes "
                       "(%s GiB) fits." % (
                           pinned, _gib(pinned), _gib(non_kv), MAX_SUGGESTED_UTILIZATION,
                           _gib(req.gpu_memory_bytes), _gib(CUDA_CONTEXT_BYTES), max(ceiling, 0),
                           _gib(max(ceiling, 0))))
    return pinned, pinned, 0


def _needed_blocks(req: PlanRequest, layout: KvLayout, max_len: int) -> int:
    per_request = layout.blocks_per_request(max_len)
    return max(per_request, math.ceil(per_request * (req.min_concurrency or 1)))


# The highest utilization suggested: the rest of the GPU holds the CUDA context and, on vLLM 0.26's model runner
# V2, the CUDA graphs, which its budget does not count (0.5-1.9 GiB on the H200 runs).
MAX_SUGGESTED_UTILIZATION = 0.98


def largest_max_model_len(num_blocks: int, layout: KvLayout, min_concurrency: Optional[float], cap: int) -> int:
    """The longest max_model_len whose min_concurrency (1 if unset) requests fit in num_blocks (0: none fits)."""
    usable_blocks = int(num_blocks // (min_concurrency or 1))
    if layout.uniform:
        return min(usable_blocks * layout.block_size, cap)
    return longest_length(lambda length: layout.blocks_per_request(length) <= usable_blocks, cap)


def utilization_that_fits(need_blocks: int, page_size_per_layer: int, layers: int, non_kv_bytes: int,
                          gpu_memory_bytes: int) -> float:
    """The lowest gpu_memory_utilization (rounded up to 0.01) whose budget holds need_blocks after the non-KV part.

    The non-KV part does not depend on the utilization, so this is exact given the estimated terms; it may exceed
    1.0 (then no utilization fits)."""
    needed = need_blocks * page_size_per_layer * layers + non_kv_bytes
    return math.ceil(needed / gpu_memory_bytes * 100) / 100.0


def tensor_parallel_that_fits(req: PlanRequest, util: float, version: tuple, layers: int,
                              max_len: int, margin: int = 0) -> Optional[int]:
    """The nearest TP (larger first) that passes vLLM's constraint checks and holds the requests, else None."""
    current = req.tensor_parallel_size
    candidates = [tp for tp in (1, 2, 4, 8) if tp > current] + [tp for tp in (8, 4, 2, 1) if tp < current]
    for tp in candidates:
        if not constraint_reasons(req, tp, version) and _fits_memory(req, tp, util, version, layers, max_len,
                                                                     margin):
            return tp
    return None


def _fits_memory(req: PlanRequest, tp: int, util: float, version: tuple, layers: int, max_len: int,
                 margin: int = 0) -> bool:
    available = _available_for(req, tp, util, version)[0] - margin
    layout = _layout_for(req, tp, req.kv_cache_dtype, version, layers)
    return layout.num_blocks(available) >= _needed_blocks(req, layout, max_len)


def suggest(req: PlanRequest, result: Plan, version: tuple, layout: KvLayout, memory_short: bool) -> dict:
    """The knobs that would make it fit: largest max_model_len; when it does not fit, utilization, fp8 KV cache,
    a TP that passes the constraint checks and fits, or expert parallelism for block-FP8 MoE shards. A knob that
    cannot fix it on its own goes to result.cannot_fit with its number."""
    shape = req.shape
    out: dict = {}
    if req.allow_long_max_model_len:
        cap = max(result.max_model_len, result.num_gpu_blocks * layout.block_size)
    else:
        cap = shape.derived_max_model_len
    # what the fit check holds: the prediction less the margin
    checked = result.available_kv_cache_bytes - result.fit_margin_bytes
    out["max_model_len"] = largest_max_model_len(layout.num_blocks(checked), layout, req.min_concurrency, cap)
    if result.fits or result.budget_bytes is None:
        return out
    if memory_short and not out["max_model_len"]:
        result.cannot_fit.append("no max_model_len fits at gpu_memory_utilization %.2f and tensor_parallel_size %d"
                                 % (result.gpu_memory_utilization, req.tensor_parallel_size))
    need_blocks = _needed_blocks(req, layout, result.max_model_len)
    util = result.gpu_memory_utilization or default_gpu_memory_utilization(version)
    layers = max(layers_per_stage(shape.num_layers, req.pipeline_parallel_size))
    if memory_short:
        non_kv = result.budget_bytes - result.available_kv_cache_bytes + result.fit_margin_bytes
        util_needed = utilization_that_fits(need_blocks, layout.page, layout.tensors, non_kv, req.gpu_memory_bytes)
        others = max(req.co_located_utilizations or [0.0])
        highest = utilization_ceiling(req.gpu_memory_bytes, result.cudagraph_outside_bytes)
        if util_needed > highest:
            result.cannot_fit.append("no gpu_memory_utilization fits at tensor_parallel_size %d: it would take %.2f, "
                                     "above %.2f" % (req.tensor_parallel_size, util_needed, highest))
        elif util_needed + others >= 1.0:
            result.cannot_fit.append("gpu_memory_utilization %.2f would fit, but with %.2f of the instances sharing "
                                     "the GPU it reaches 1.0" % (util_needed, others))
        else:
            out["gpu_memory_utilization"] = util_needed
        if req.kv_cache_dtype == "auto":
            fp8 = _layout_for(req, req.tensor_parallel_size, "fp8", version, layers)
            if fp8.num_blocks(checked) >= _needed_blocks(req, fp8, result.max_model_len):
                out["kv_cache_dtype"] = "fp8"
        if vision_tower_loaded(req):
            # text-only: the vision tower's weights and its encoder profile leave the budget
            text_only = {name: 0 for name, _tokens in served_modalities(shape)}
            if plan(PlanRequest(**dict(req.__dict__, limit_mm_per_prompt=text_only))).fits:
                out["limit_mm_per_prompt"] = text_only
    tp = tensor_parallel_that_fits(req, util, version, layers, result.max_model_len, result.fit_margin_bytes)
    if tp is not None:
        out["tensor_parallel_size"] = tp
    elif memory_short:
        result.cannot_fit.append("no tensor_parallel_size of 1, 2, 4 or 8 fits at gpu_memory_utilization %.2f"
                                 % util)
    current = req.tensor_parallel_size
    if shape.is_moe and not req.enable_expert_parallel and constraint_reasons(req, current, version):
        with_ep = PlanRequest(**dict(req.__dict__, enable_expert_parallel=True))
        if not constraint_reasons(with_ep, current, version):
            out["enable_expert_parallel"] = True
    return out


def fix_text(result: Plan) -> str:
    """The suggestions as a sentence with their numbers, for a failed task's message."""
    sugg = result.suggestions
    fixes = []
    longest = sugg.get("max_model_len")
    if longest is not None and 0 < longest < result.max_model_len:
        fixes.append("max_model_len %d or less (the largest that fits)" % longest)
    if "gpu_memory_utilization" in sugg:
        fixes.append("gpu_memory_utilization %.2f" % sugg["gpu_memory_utilization"])
    if "tensor_parallel_size" in sugg:
        fixes.append("tensor_parallel_size %d" % sugg["tensor_parallel_size"])
    if "kv_cache_dtype" in sugg:
        fixes.append("kv_cache_dtype %s" % sugg["kv_cache_dtype"])
    if "limit_mm_per_prompt" in sugg:
        limits = json.dumps(sugg["limit_mm_per_prompt"], sort_keys=True)
        fixes.append("limit_mm_per_prompt %s (text only: no vision tower)" % limits)
    if sugg.get("enable_expert_parallel"):
        fixes.append("enable_expert_parallel true")
    return ("Any one of these fits: " + "; ".join(fixes) + ".") if fixes else ""


def summary(result: Plan) -> str:
    """One line a failed task can show: verdict, reasons, the fixes with numbers, and what cannot fit."""
    head = "fits" if result.fits else "does not fit"
    text = "KV plan %s: %d tokens (%d blocks), %.2fx concurrency at max_model_len %d, %s GiB for KV" % (
        head, result.kv_cache_tokens, result.num_gpu_blocks, result.max_concurrency, result.max_model_len,
        _gib(result.available_kv_cache_bytes))
    if result.reasons:
        text += ". " + " ".join(result.reasons)
    if fix_text(result):
        text += " " + fix_text(result)
    if result.cannot_fit:
        text += " Not enough alone: " + "; ".join(result.cannot_fit) + "."
    return text


# --- vLLM startup log ----------------------------------------------------------------------------------------

def logged_kv_cache_tokens(log_text: str) -> Optional[dict]:
    """The last `CPU|GPU KV cache size: N tokens` line of a vLLM startup log (0.8+ V1 wording), else None.

    Returns {"device": "cpu"|"gpu", "tokens": N, "max_model_len": L or None, "max_concurrency": X or None}; the
    concurrency is on the same line (0.32 CPU) or on the next log line (0.26 GPU).
    """
    found = None
    for line in log_text.splitlines():
        marker = line.find(" KV cache size: ")
        if marker >= 3 and line[marker - 3:marker] in ("CPU", "GPU"):
            rest = line[marker + len(" KV cache size: "):]
            number = rest.split(" tokens", 1)[0].replace(",", "").strip()
            if number.isdigit():
                found = {"device": line[marker - 3:marker].lower(), "tokens": int(number), "max_model_len": None,
                         "max_concurrency": None}
                _read_concurrency(rest, found)
        elif found and found["max_concurrency"] is None:
            _read_concurrency(line, found)
    return found


def _read_concurrency(text: str, found: dict) -> None:
    """Fill max_model_len / max_concurrency from `Maximum concurrency for L tokens per request: X.XXx`."""
    if "Maximum concurrency for " not in text:
        return
    tail = text.split("Maximum concurrency for ", 1)[1]
    length = tail.split(" tokens", 1)[0].replace(",", "").strip()
    factor = tail.split(": ", 1)[-1].strip().rstrip("x")
    if length.isdigit():
        found["max_model_len"] = int(length)
    try:
        found["max_concurrency"] = float(factor)
    except ValueError:
        pass
