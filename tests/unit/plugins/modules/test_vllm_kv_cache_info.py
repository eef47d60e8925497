# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module against a real /metrics page served locally: the record, and a warning beyond the limit."""
from __future__ import annotations

import json

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_kv_cache_info

PLAN = {"kv_cache_tokens": 1048576, "num_gpu_blocks": 65536, "max_concurrency": 512.0, "max_model_len": 2048,
        "available_kv_cache_bytes": 1 << 30, "kv_cache_memory_bytes": None, "fits": True}


def warnings(out):
    """The module's warning texts (ansible-core 2.19 emits them as structured events)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in out.get("warnings", [])]


@pytest.fixture
def call(call_module):
    return lambda **args: call_module(vllm_kv_cache_info, **args)


def test_exact_plan_is_recorded_without_warning(vllm_endpoints, call):
    url, seen = vllm_endpoints.url, vllm_endpoints.seen
    rc, out = call(url=url, predicted=PLAN, api_key="secret-key")
    record = out["record"]
    assert rc == 0 and not out["changed"] and not warnings(out)
    assert record["predicted"]["kv_cache_tokens"] == record["actual"]["kv_cache_tokens"] == 1048576
    assert record["difference_tokens"] == 0 and record["within_limit"] is True
    assert seen[-1] == ("GET", "/metrics", "Bearer secret-key") and "secret-key" not in json.dumps(out)


def test_a_plan_that_promised_more_warns(vllm_endpoints, call):
    rc, out = call(url=vllm_endpoints.url, predicted=dict(PLAN, kv_cache_tokens=2 * 1048576),
                   max_difference_pct=5)
    assert rc == 0 and out["record"]["within_limit"] is False and out["record"]["difference_pct"] == -50.0
    assert any("vllm_server_kv_cache_memory" in warning for warning in warnings(out))


def test_without_a_plan_only_the_actual_is_kept(vllm_endpoints, call):
    rc, out = call(url=vllm_endpoints.url)
    assert rc == 0 and out["record"]["predicted"] is None and out["record"]["actual"]["kv_cache_tokens"] == 1048576


def test_an_unreadable_server_warns_and_records_nothing(call):
    rc, out = call(url="http://127.0.0.1:9", predicted=PLAN, request_timeout=2)
    assert rc == 0 and out["record"]["actual"] is None
    assert any("cannot read" in warning for warning in warnings(out))


def test_check_apply_and_again_record_the_same_and_change_nothing(call, vllm_endpoints):
    url = vllm_endpoints.url
    (rc1, check), (rc2, apply), (rc3, again) = (call(url=url, predicted=PLAN, _ansible_check_mode=mode)
                                                for mode in (True, False, False))
    assert rc1 == rc2 == rc3 == 0
    assert check["changed"] is False and apply["changed"] is False and again["changed"] is False
    assert check["record"]["actual"] == apply["record"]["actual"] == again["record"]["actual"]
    assert apply["record"]["actual"]["kv_cache_tokens"] == 1048576
