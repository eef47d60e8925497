import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_args import (
    VllmArgsError, parse_version, render_serve_args)

SEED = {  # the seed deployment: Qwen3-30B-A3B-FP8, TP2, prefix caching and chunked prefill on
    "model": "Qwen/Qwen3-30B-A3B-FP8", "served_model_name": "qwen3-30b-a3b", "port": 8000,
    "tensor_parallel_size": 2, "max_model_len": 32768, "gpu_memory_utilization": 0.9,
    "max_num_batched_tokens": 8192, "max_num_seqs": 64, "kv_cache_dtype": "auto",
    "enable_chunked_prefill": True, "enable_prefix_caching": True,
}


def flag_value(args, flag):
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("text, parsed", [("v0.32.0", (0, 32, 0)), ("0.9.2", (0, 9, 2)), ("v0.32.0-lab2", (0, 32, 0))])
def test_parse_version(text, parsed):
    assert parse_version(text) == parsed


@pytest.mark.parametrize("text", ["latest", "", "nightly-2026", "v1"])
def test_parse_version_refuses_unpinned_tags(text):
    with pytest.raises(VllmArgsError, match="vX.Y.Z"):
        parse_version(text)


def test_seed_settings_on_current_release():
    args = render_serve_args(SEED, "v0.32.0")
    assert args[:2] == ["--model", "Qwen/Qwen3-30B-A3B-FP8"]
    assert flag_value(args, "--tensor-parallel-size") == "2"
    assert flag_value(args, "--served-model-name") == "qwen3-30b-a3b"
    assert flag_value(args, "--gpu-memory-utilization") == "0.9"
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert "--kv-cache-dtype" not in args  # auto is vLLM's default
    assert "--disable-log-requests" not in args  # removed by 0.20: passing it makes the server refuse to start


def test_request_logging_flag_only_before_it_became_the_default():
    assert "--disable-log-requests" in render_serve_args(SEED, "v0.9.2")
    assert "--disable-log-requests" not in render_serve_args(SEED, "v0.10.0")


def test_switching_a_default_on_feature_off():
    settings = dict(SEED, enable_prefix_caching=False)
    assert "--no-enable-prefix-caching" in render_serve_args(settings, "v0.32.0")
    # 0.6 had no negative flag; off was its default
    old = render_serve_args(settings, "v0.6.6")
    assert "--no-enable-prefix-caching" not in old and "--enable-prefix-caching" not in old


def test_unset_settings_leave_vllm_defaults():
    args = render_serve_args({"model": "m", "max_model_len": None, "revision": ""}, "v0.32.0")
    assert args == ["--model", "m"]


def test_fp8_kv_cache_and_parallelism_flags():
    args = render_serve_args(dict(SEED, kv_cache_dtype="fp8", enable_expert_parallel=True,
                                  disable_custom_all_reduce=True, pipeline_parallel_size=2), "v0.32.0")
    assert flag_value(args, "--kv-cache-dtype") == "fp8"
    assert flag_value(args, "--pipeline-parallel-size") == "2"
    assert "--enable-expert-parallel" in args and "--disable-custom-all-reduce" in args


def test_enforce_eager_only_when_asked():
    assert "--enforce-eager" not in render_serve_args(SEED, "v0.32.0")
    assert "--enforce-eager" in render_serve_args(dict(SEED, enforce_eager=True), "v0.32.0")


def test_extra_args_come_last():
    args = render_serve_args(dict(SEED, extra_args=["--reasoning-parser", "qwen3"]), "v0.32.0")
    assert args[-2:] == ["--reasoning-parser", "qwen3"]


def test_removed_flag_in_extra_args_is_refused_on_new_releases():
    with pytest.raises(VllmArgsError, match="removed in 0.20"):
        render_serve_args(dict(SEED, extra_args=["--disable-log-requests"]), "v0.20.0")


def test_api_key_on_the_command_line_is_refused():
    with pytest.raises(VllmArgsError, match="vllm_server_api_key"):
        render_serve_args(dict(SEED, extra_args=["--api-key=secret"]), "v0.32.0")


def test_model_is_required():
    with pytest.raises(VllmArgsError, match="model is required"):
        render_serve_args({"model": ""}, "v0.32.0")


# --- the pinned KV pool (--kv-cache-memory-bytes) -------------------------------------------------------------

def test_no_kv_pool_flag_unless_asked():
    assert "--kv-cache-memory-bytes" not in render_serve_args(dict(SEED, kv_cache_memory=""), "v0.32.0")


def test_kv_pool_in_bytes():
    args = render_serve_args(dict(SEED, kv_cache_memory="42949672960"), "v0.32.0")
    assert flag_value(args, "--kv-cache-memory-bytes") == "42949672960"


def test_kv_pool_auto_is_the_plans():
    args = render_serve_args(dict(SEED, kv_cache_memory="auto", kv_cache_memory_planned=76541263872), "v0.10.2")
    assert flag_value(args, "--kv-cache-memory-bytes") == "76541263872"


@pytest.mark.parametrize("planned", [None, "", 0, "None"])
def test_kv_pool_auto_without_a_plan_is_refused(planned):
    with pytest.raises(VllmArgsError, match="no KV plan"):
        render_serve_args(dict(SEED, kv_cache_memory="auto", kv_cache_memory_planned=planned), "v0.32.0")


def test_kv_pool_auto_on_the_cpu_renders_nothing():
    """VLLM_CPU_KVCACHE_SPACE, which the plan used, already pins the CPU pool."""
    args = render_serve_args(dict(SEED, kv_cache_memory="auto", cpu_mode=True), "v0.32.0")
    assert "--kv-cache-memory-bytes" not in args


@pytest.mark.parametrize("version, cpu_mode", [("v0.10.1", False), ("v0.19.1", True)])
def test_kv_pool_on_a_vllm_without_the_flag(version, cpu_mode):
    with pytest.raises(VllmArgsError, match="needs vLLM"):
        render_serve_args(dict(SEED, kv_cache_memory="1073741824", cpu_mode=cpu_mode), version)


@pytest.mark.parametrize("value", ["4GiB", "-1", "0", "half"])
def test_kv_pool_bad_values(value):
    with pytest.raises(VllmArgsError, match="vllm_server_kv_cache_memory"):
        render_serve_args(dict(SEED, kv_cache_memory=value), "v0.32.0")


def test_aliases_follow_the_served_name_once_each():
    args = render_serve_args(dict(SEED, served_model_aliases=["chat", "qwen3-30b-a3b", "chat"]), "v0.32.0")
    start = args.index("--served-model-name")
    assert args[start:start + 3] == ["--served-model-name", "qwen3-30b-a3b", "chat"]
    assert args[start + 3].startswith("--")


def test_the_pooling_runner_by_version():
    assert flag_value(render_serve_args(dict(SEED, runner="pooling"), "v0.32.0"), "--runner") == "pooling"
    assert flag_value(render_serve_args(dict(SEED, runner="pooling"), "v0.10.0"), "--task") == "embed"
    generate = render_serve_args(dict(SEED, runner="generate"), "v0.32.0")
    assert "--runner" not in generate and "--task" not in generate
    with pytest.raises(VllmArgsError, match="runner must be generate or pooling"):
        render_serve_args(dict(SEED, runner="classify"), "v0.32.0")


def test_limit_mm_per_prompt_as_vllm_json_only_when_set():
    assert "--limit-mm-per-prompt" not in render_serve_args(dict(SEED, limit_mm_per_prompt={}), "v0.26.0")
    args = render_serve_args(dict(SEED, limit_mm_per_prompt={"video": "0", "image": 2}), "v0.26.0")
    assert flag_value(args, "--limit-mm-per-prompt") == '{"image":2,"video":0}'
