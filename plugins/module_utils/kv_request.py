# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the KV-cache planner plans from and what it returns, shared by the onprem.vllm.kv_headroom module (on a host)
and the onprem.vllm.kv_preflight action (on the controller): the argument spec (documented in the kv_plan doc
fragment), the request built from it, the result's facts and the preflight's verdict on them. Pure: the one read is
load_model_shape's, of the config path given."""
from __future__ import annotations

import json

from ansible_collections.onprem.vllm.plugins.module_utils.kv_cache import (
    DEFAULT_VLLM_VERSION,
    PlanInputError,
    PlanRequest,
    parse_kv_cache_memory,
    plan,
    summary,
)
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import ModelConfigError, load_model_shape, shape_with_weights

__all__ = ["ARGUMENT_SPEC", "ModelConfigError", "PlanInputError", "build_request", "plan", "preflight_verdict",
           "result_facts", "summary"]

GIB = 1 << 30

# The planner's options (plugins/doc_fragments/kv_plan.py documents them).
ARGUMENT_SPEC = dict(
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
    kv_cache_memory=dict(type="str", default=""),
    kv_cache_memory_margin_pct=dict(type="float"),
)


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


def preflight_verdict(host, deployment_name, device, facts):
    """(failed, message) of the preflight's KV step on a plan's facts (result_facts): the refusal with the planner's
    reasons and suggested settings, or what the plan gives each worker."""
    of_deployment = (" of deployment %s" % deployment_name) if deployment_name else ""
    if not facts["fits"]:
        return True, "The planned model%s does not fit on %s: %s. Suggestions: %s" % (
            of_deployment, host, " | ".join(facts["reasons"]), json.dumps(facts["suggestions"] or {}, sort_keys=True))
    if facts["covered"]:
        message = "%s KV-cache tokens, %s concurrent requests of %s tokens" % (
            facts["kv_cache_tokens"], facts["max_concurrency"], facts["max_model_len"])
    else:
        message = "KV-cache tokens not predicted (%s)" % ((facts["notes"] or [""])[0],)
    message += " on each %s" % ("CPU" if device == "cpu" else "GPU")
    if facts["kv_cache_memory_bytes"]:
        message += ", pinned pool --kv-cache-memory-bytes %d" % facts["kv_cache_memory_bytes"]
    if facts["margin_family"]:
        margin = (facts["kv_cache_memory_margin_bytes"] or 0) or (facts["fit_margin_bytes"] or 0)
        message += ", margin %.2f GiB (%s)" % (margin / GIB, facts["margin_family"])
    return False, message
