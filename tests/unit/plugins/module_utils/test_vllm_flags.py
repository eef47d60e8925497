# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The renderer against each supported release's real `vllm serve --help=all` (tests/fixtures/vllm-help: 0.26.0
captured on an H200 from the vLLM wheel, 0.32.0 from the lab's CPU image, 0.34.0 from the release's source as its
SOURCE.md says): every plan setting renders to flags that
release has, the utilization the planner assumes is the release's default, and extra_args flags a release does not
have are refused with what to do."""
from __future__ import annotations

import importlib.util
import os

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.kv_cache import PlanInputError, default_gpu_memory_utilization
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_args import VllmArgsError, render_serve_args
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_flags import RELEASES

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
VERSIONS = sorted(RELEASES)


def _tool():
    spec = importlib.util.spec_from_file_location("vllm_flags_tool", os.path.join(ROOT, "tools", "vllm_flags.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flag_data_is_the_captures():
    tool = _tool()
    found = tool.captures()
    assert sorted(found) == VERSIONS and len(VERSIONS) >= 2
    with open(tool.MODULE) as handle:
        assert handle.read() == tool.render(found), "run tools/vllm_flags.py"


def every_setting(runner, booleans, cpu_mode=False):
    return {"model": "Qwen/Qwen3-30B-A3B-FP8", "revision": "c" * 40, "served_model_name": "qwen3",
            "served_model_aliases": ["chat"], "runner": runner, "port": 8000, "tensor_parallel_size": 2,
            "pipeline_parallel_size": 1, "max_model_len": 32768, "gpu_memory_utilization": 0.9,
            "max_num_batched_tokens": 8192, "max_num_seqs": 64, "kv_cache_dtype": "fp8",
            "enable_chunked_prefill": booleans, "enable_prefix_caching": booleans, "enable_expert_parallel": True,
            "disable_custom_all_reduce": True, "enforce_eager": True, "kv_cache_memory": 8 * 2**30,
            "cpu_mode": cpu_mode, "extra_args": ["--reasoning-parser", "qwen3"]}


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: ".".join(map(str, v)))
@pytest.mark.parametrize("runner", ["generate", "pooling"])
@pytest.mark.parametrize("booleans", [True, False])
def test_every_plan_setting_renders_to_flags_the_release_has(version, runner, booleans):
    args = render_serve_args(every_setting(runner, booleans), "v%d.%d.%d" % version)
    flags = [arg for arg in args if arg.startswith("--")]
    assert len(flags) >= 18
    assert [flag for flag in flags if flag not in RELEASES[version]["flags"]] == []


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: ".".join(map(str, v)))
def test_the_planner_s_default_utilization_is_the_release_s(version):
    """A release whose --help states one default: the planner assumes it. 0.34.0 states none (1.0 with its
    extensible KV cache, 0.92 otherwise): the planner assumes nothing and asks for the setting."""
    if RELEASES[version]["utilization_default"] is None:
        with pytest.raises(PlanInputError, match="set onprem_vllm_gpu_memory_utilization"):
            default_gpu_memory_utilization(version)
    else:
        assert default_gpu_memory_utilization(version) == RELEASES[version]["utilization_default"]


def test_0_34_spells_a_switched_off_default_as_disable():
    args = render_serve_args(every_setting("generate", False), "v0.34.0")
    assert "--disable-prefix-caching" in args and "--disable-chunked-prefill" in args
    assert "--no-enable-prefix-caching" in render_serve_args(every_setting("generate", False), "v0.32.0")


def test_extra_args_flags_the_release_does_not_have_are_refused_with_what_to_do():
    base = every_setting("generate", None)
    with pytest.raises(VllmArgsError, match=r"--max-num-partial-prefills, which vLLM 0\.32\.0's `vllm serve` does "
                                            r"not have \(vLLM 0\.26\.0 had it"):
        render_serve_args(dict(base, extra_args=["--max-num-partial-prefills", "2"]), "v0.32.0-lab2")
    with pytest.raises(VllmArgsError, match="check its spelling"):
        render_serve_args(dict(base, extra_args=["--max-model-lenn", "4096"]), "v0.26.0")
    with pytest.raises(VllmArgsError, match="request logging is off by default since 0.10"):
        render_serve_args(dict(base, extra_args=["--disable-log-requests"]), "v0.26.0")
    # vLLM's own parser takes underscores and --flag=value.
    assert render_serve_args(dict(base, extra_args=["--max_logprobs=40"]), "v0.32.0")[-1] == "--max_logprobs=40"
    # 0.34 has --disable-log-requests again (the negation of --enable-log-requests): its capture decides.
    assert render_serve_args(dict(base, extra_args=["--disable-log-requests"]), "v0.34.0")[-1] == "--disable-log-requests"
    # A release without a capture: its flags are not known here, nothing is refused.
    assert render_serve_args(dict(base, extra_args=["--max-model-lenn", "1"]), "v0.35.0")[-2:] == ["--max-model-lenn", "1"]
