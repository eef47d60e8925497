# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KV step's verdict on a plan's facts (module_utils/kv_request.py), on plans of the real models' configs."""
from __future__ import annotations

import os

from ansible_collections.onprem.vllm.plugins.module_utils import kv_request

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")
GIB = 1 << 30


def facts_of(**params):
    request = {name: spec.get("default") for name, spec in kv_request.ARGUMENT_SPEC.items()}
    request.update(params)
    return kv_request.result_facts(kv_request.plan(kv_request.build_request(request)))


def test_a_plan_that_fits_says_what_each_gpu_holds():
    facts = facts_of(model_config_path=os.path.join(MODELS, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                     max_model_len=32768, vllm_version="0.11.0")
    failed, message = kv_request.preflight_verdict("ws1", "", "cuda", facts)
    assert not failed
    assert message == "%d KV-cache tokens, %s concurrent requests of 32768 tokens on each GPU" % (
        facts["kv_cache_tokens"], facts["max_concurrency"])


def test_a_pinned_pool_and_its_margin_are_named():
    facts = facts_of(model_config_path=os.path.join(MODELS, "Qwen3-8B"), gpu_memory_bytes=80 * GIB,
                     max_model_len=32768, vllm_version="0.26.0", kv_cache_memory="auto")
    failed, message = kv_request.preflight_verdict("ws1", "", "cuda", facts)
    assert not failed and facts["kv_cache_memory_bytes"] and facts["margin_family"]
    assert ", pinned pool --kv-cache-memory-bytes %d, margin " % facts["kv_cache_memory_bytes"] in message
    assert message.endswith(" GiB (%s)" % facts["margin_family"])


def test_a_misfit_names_the_deployment_the_host_the_reasons_and_the_fix():
    facts = facts_of(model_config_path=os.path.join(MODELS, "Qwen3-30B-A3B-FP8"), gpu_memory_bytes=24 * GIB,
                     tensor_parallel_size=4, vllm_version="0.11.0")
    failed, message = kv_request.preflight_verdict("ws3", "chat", "cuda", facts)
    assert failed
    assert message.startswith("The planned model of deployment chat does not fit on ws3: ")
    assert "is not divisible by weight quantization block_n = 128" in message
    assert '"tensor_parallel_size": 2' in message.split("Suggestions: ", 1)[1]


def test_a_model_outside_the_formula_is_said_not_predicted():
    facts = dict(facts_of(model_config_path=os.path.join(MODELS, "Qwen3-8B"), device="cpu",
                          cpu_kv_cache_space_bytes=GIB, max_model_len=2048), covered=False,
                 notes=["sliding window"])
    assert kv_request.preflight_verdict("ws1", "", "cpu", facts) == (
        False, "KV-cache tokens not predicted (sliding window) on each CPU")
