# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module wiring: facts out, fail_json with the suggestion on a misfit, clear messages on bad input."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.onprem.vllm.plugins.modules import kv_headroom

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")
GIB = 1 << 30


@pytest.fixture
def call(call_module):
    return lambda **args: call_module(kv_headroom, **args)


def test_fits_returns_the_facts(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                   max_model_len=32768, vllm_version="0.11.0", _ansible_check_mode=True)
    assert rc == 0 and out["fits"] and not out["changed"]
    for key in ("kv_bytes_per_token", "weights_bytes_per_gpu", "available_kv_cache_bytes", "num_gpu_blocks",
                "kv_cache_tokens", "max_concurrency", "reasons", "suggestions"):
        assert key in out
    assert out["kv_cache_tokens"] == out["num_gpu_blocks"] * 16


def test_the_config_given_as_data_plans_as_the_file_does(call):
    """hf_model_info's facts (the parsed config and the weights' size) give the plan the file and checkpoint give."""
    with open(os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8", "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    common = dict(gpu_memory_bytes=80 * GIB, max_model_len=32768, vllm_version="0.11.0")
    _rc, by_path = call(model_config_path=os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8"), **common)
    rc, by_data = call(model_config=config, **common)
    assert rc == 0 and by_data["num_gpu_blocks"] == by_path["num_gpu_blocks"] > 0
    _rc, heavier = call(model_config=config, model_weight_bytes=by_path["weights_bytes_per_gpu"] + 2 * GIB, **common)
    assert heavier["weights_bytes_per_gpu"] == by_path["weights_bytes_per_gpu"] + 2 * GIB
    assert heavier["num_gpu_blocks"] < by_data["num_gpu_blocks"]
    rc, out = call(**common)
    assert rc == 1 and "model_config_path, model_config" in out["msg"]


def test_misfit_fails_with_suggestion_and_facts(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8"),
                   gpu_memory_bytes=24 * GIB, tensor_parallel_size=4, vllm_version="0.11.0")
    assert rc == 1 and out["failed"]
    assert "is not divisible by weight quantization block_n = 128" in out["msg"]
    assert "tensor_parallel_size 2" in out["msg"]
    assert out["fits"] is False and out["num_gpu_blocks"] > 0


def test_misfit_reported_without_failing(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Llama-3.1-8B-Instruct"),
                   available_kv_cache_bytes=4 * GIB, fail_on_misfit=False)
    assert rc == 0 and out["fits"] is False
    assert out["suggestions"]["max_model_len"] == 32768


def test_gpu_memory_from_topology_facts(call):
    topology = {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 25757220864,
                          "memory_reserved_bytes": 333447168},
                         {"index": 1, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 25757220864,
                          "memory_reserved_bytes": 333447168}]}
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8"), gpu_topology=topology,
                   tensor_parallel_size=2, max_model_len=16384, vllm_version="0.11.0")
    assert rc == 0, out
    assert out["gpu_memory_utilization"] == 0.9


def test_cpu_lab_mode_without_gpu_memory(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-0.6B"), device="cpu",
                   cpu_kv_cache_space_bytes=GIB, max_model_len=4096)
    assert rc == 0
    assert out["kv_cache_tokens"] == GIB // (28 * 8 * 128 * 2 * 2 * 16) * 16


@pytest.mark.parametrize("args,match", [
    ({"gpu_memory_bytes": -5}, "gpu_memory_bytes must be >= 1"),
    ({"gpu_memory_bytes": GIB, "gpu_memory_utilization": 1.2}, "gpu_memory_utilization must be in"),
    ({"gpu_memory_bytes": GIB, "kv_cache_dtype": "int8"}, "kv_cache_dtype"),
    ({"gpu_memory_bytes": GIB, "tensor_parallel_size": "2.5"}, "tensor_parallel_size"),
    ({}, "gpu_memory_bytes is required"),
])
def test_bad_input_is_a_message_not_a_traceback(args, match, call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), **args)
    assert rc == 1 and match in out["msg"]
    assert "Traceback" not in out["msg"]


def test_config_missing_heads(tmp_path, call):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64,
                                                      "max_position_embeddings": 128}))
    rc, out = call(model_config_path=str(tmp_path), gpu_memory_bytes=GIB)
    assert rc == 1 and "num_attention_heads" in out["msg"]


def test_misfit_message_gives_the_fixes_with_numbers(call):
    # Qwen3-8B at 40960 tokens x 8 requests on a 24 GiB GPU (vLLM 0.26 terms): short of KV at TP1
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=24 * GIB,
                   max_model_len=40960, min_concurrency=8, vllm_version="0.26.0")
    assert rc == 1 and out["fits"] is False
    longest = out["suggestions"]["max_model_len"]
    assert 0 < longest < 40960
    assert "max_model_len %d or less" % longest in out["msg"]
    assert "tensor_parallel_size %d" % out["suggestions"]["tensor_parallel_size"] in out["msg"]
    # no utilization at TP1 holds 8 requests: said with the number it would take
    assert "gpu_memory_utilization" not in out["suggestions"]
    assert out["cannot_fit"] and out["cannot_fit"][0].startswith("no gpu_memory_utilization fits")
    assert "Not enough alone: no gpu_memory_utilization fits at tensor_parallel_size 1: it would take" in out["msg"]


def test_auto_kv_cache_memory_returns_the_pool_to_render(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                   max_model_len=32768, vllm_version="0.32.0", kv_cache_memory="auto", kv_cache_memory_margin_pct=3.0)
    assert rc == 0 and out["fits"]
    assert out["kv_cache_memory_bytes"] == out["available_kv_cache_bytes"] > 0
    assert out["kv_cache_tokens"] == out["kv_cache_memory_bytes"] // out["kv_bytes_per_token"] // 16 * 16
    assert out["kv_cache_memory_margin_bytes"] == -(-3 * out["gpu_memory_utilization"] * 80 * GIB // 100)


def test_unset_kv_cache_memory_renders_nothing(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                   max_model_len=32768, vllm_version="0.32.0")
    assert rc == 0 and out["kv_cache_memory_bytes"] is None and out["kv_cache_memory_margin_bytes"] == 0


def test_kv_cache_memory_on_a_vllm_without_the_flag_fails_clearly(call):
    rc, out = call(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                   vllm_version="0.9.2", kv_cache_memory="auto")
    assert rc == 1 and "needs vLLM 0.10.2 or later" in out["msg"] and "vllm_server_kv_cache_memory" in out["msg"]


def test_check_apply_and_again_give_the_same_facts_and_change_nothing(call):
    args = dict(model_config_path=os.path.join(FIXTURES, "Qwen3-8B"), gpu_memory_bytes=80 * GIB, max_model_len=32768,
                vllm_version="0.32.0")
    (rc1, check), (rc2, apply), (rc3, again) = (call(_ansible_check_mode=mode, **args) for mode in (True, False, False))
    assert rc1 == rc2 == rc3 == 0
    assert check["changed"] is False and apply["changed"] is False and again["changed"] is False
    assert check["num_gpu_blocks"] == apply["num_gpu_blocks"] == again["num_gpu_blocks"] > 0
    assert check == apply == again


def test_text_only_limits_reach_the_plan(call):
    """limit_mm_per_prompt from a template (counts as strings): every modality 0 plans Qwen3-VL without its tower."""
    common = dict(model_config_path=os.path.join(FIXTURES, "Qwen3-VL-8B-Instruct"), gpu_memory_bytes=80 * GIB,
                  max_model_len=32768, vllm_version="0.26.0")
    _rc, full = call(**common)
    rc, text = call(limit_mm_per_prompt={"image": "0", "video": "0"}, **common)
    assert rc == 0 and text["weights_bytes_per_gpu"] < full["weights_bytes_per_gpu"]
    rc, bad = call(limit_mm_per_prompt={"image": "many"}, **common)
    assert rc == 1 and "limit_mm_per_prompt must map modalities" in bad["msg"]
