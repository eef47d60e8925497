# -*- coding: utf-8 -*-
# Copyright: onprem.vllm contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vLLM really allocated for its KV cache, against what the plan predicted (pure, standard library only).

The running server exports its cache configuration on /metrics as the info series `vllm:cache_config_info`, one
label per CacheConfig field (vllm/v1/metrics/loggers.py, log_metrics_info): `num_gpu_blocks` is the block count the
engine core allocated (the null block included), `block_size` its tokens per block, `kv_cache_memory_bytes` the
pinned pool ('None' when vLLM sized it). vLLM 0.32 also exports the startup log's two numbers ("KV cache size: N
tokens, Maximum concurrency for L tokens per request: X") as `kv_cache_size_tokens` and `kv_cache_max_concurrency`;
older servers get them computed from the blocks with vLLM's formula. The CPU backend picks 128-token blocks (the
plan counts 16-token ones), so tokens and concurrency are compared, not block counts.
Used by the vllm_kv_cache_info module after the health gate and by benchmarks/kv_accuracy.py --fleet.
"""
from __future__ import annotations

from typing import Optional

CACHE_CONFIG_INFO = "vllm:cache_config_info"
# What the plan publishes and the deployment record keeps of it.
PREDICTED_KEYS = ("kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "max_model_len", "available_kv_cache_bytes",
                  "kv_cache_memory_bytes")


def _labels(text: str) -> dict:
    """Prometheus text-format labels `a="x",b="y\\"z"` -> dict (escapes \\\\, \\" and \\n undone)."""
    labels = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            break
        name = text[i:eq].strip().lstrip(",").strip()
        j = eq + 1
        if j >= n or text[j] != '"':
            break
        j += 1
        value = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                value.append({"n": "\n"}.get(text[j + 1], text[j + 1]))
                j += 2
                continue
            value.append(text[j])
            j += 1
        labels[name] = "".join(value)
        i = j + 1
    return labels


def parse_cache_config_info(metrics_text: str) -> Optional[dict]:
    """The labels of the first `vllm:cache_config_info{...}` sample of a /metrics page, else None."""
    for line in metrics_text.splitlines():
        if line.startswith(CACHE_CONFIG_INFO + "{"):
            end = line.rfind("}")
            if end > len(CACHE_CONFIG_INFO):
                return _labels(line[len(CACHE_CONFIG_INFO) + 1:end])
    return None


def _int_or_none(value) -> Optional[int]:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def _float_or_none(value) -> Optional[float]:
    try:
        return float(str(value))
    except ValueError:
        return None


def actual_from_labels(labels: dict, max_model_len: Optional[int] = None) -> Optional[dict]:
    """The allocation from cache_config_info's labels; None when the engine has not reported its blocks."""
    blocks = _int_or_none(labels.get("num_gpu_blocks"))
    block_size = _int_or_none(labels.get("block_size"))
    if not blocks or not block_size:
        return None
    actual = {
        "num_gpu_blocks": blocks,
        "block_size": block_size,
        "kv_cache_tokens": _int_or_none(labels.get("kv_cache_size_tokens")) or blocks * block_size,
        "kv_cache_memory_bytes": _int_or_none(labels.get("kv_cache_memory_bytes")),
        "cache_dtype": labels.get("cache_dtype"),
        "max_concurrency": _float_or_none(labels.get("kv_cache_max_concurrency")),
    }
    if actual["max_concurrency"] is None and max_model_len:
        # vLLM's own formula for "Maximum concurrency for L tokens per request" (kv_cache_utils)
        actual["max_concurrency"] = round(blocks / -(-int(max_model_len) // block_size), 2)
    return actual


def predicted_from_plan(plan: Optional[dict]) -> Optional[dict]:
    """The part of a kv_headroom result (gpu_preflight_result.kv_plan) a deployment record keeps; None without a plan."""
    if not plan or plan.get("kv_cache_tokens") in (None, ""):
        return None
    return {key: plan.get(key) for key in PREDICTED_KEYS}


def compare(predicted: Optional[dict], actual: Optional[dict], max_difference_pct: float) -> dict:
    """Predicted against actual KV tokens: the record entry, and a warning text when they differ beyond the limit.

    difference_pct is (actual - predicted) / predicted in %; positive: vLLM allocated more than promised."""
    entry = {"predicted": predicted, "actual": actual, "difference_tokens": None, "difference_pct": None,
             "max_difference_pct": max_difference_pct, "within_limit": None}
    warning = ""
    if predicted and actual:
        want, got = int(predicted["kv_cache_tokens"]), int(actual["kv_cache_tokens"])
        entry["difference_tokens"] = got - want
        entry["difference_pct"] = round(100.0 * (got - want) / want, 2) if want else None
        entry["within_limit"] = want > 0 and abs(got - want) * 100.0 <= max_difference_pct * want
        if not entry["within_limit"]:
            warning = ("vLLM allocated %d KV tokens (%d blocks), the plan predicted %d (%s %%, limit %s %%): the "
                       "concurrency the plan promised (%sx at %s tokens) is not what runs (%sx). Pin the pool with "
                       "vllm_server_kv_cache_memory (auto or bytes), or re-plan with the GPU's real free memory." % (
                           got, actual["num_gpu_blocks"], want, entry["difference_pct"], max_difference_pct,
                           predicted.get("max_concurrency"), predicted.get("max_model_len"),
                           actual.get("max_concurrency")))
    return {"entry": entry, "warning": warning}


def fleet_rows(records: dict) -> list:
    """(host, predicted tokens, actual tokens, predicted and actual concurrency, difference %, verdict) per host."""
    rows = []
    for host in sorted(records):
        record = records[host] or {}
        kv = record.get("kv_cache") or {}
        predicted, actual = kv.get("predicted") or {}, kv.get("actual") or {}
        if not predicted or not actual:
            verdict = "NO PLAN" if actual else ("NO RECORD" if not record else "NOT READ")
        elif kv.get("difference_tokens") == 0:
            verdict = "EXACT"
        else:
            verdict = "WITHIN LIMIT" if kv.get("within_limit") else "BEYOND LIMIT"
        rows.append((host, predicted.get("kv_cache_tokens"), actual.get("kv_cache_tokens"),
                     predicted.get("max_concurrency"), actual.get("max_concurrency"), kv.get("difference_pct"),
                     verdict))
    return rows


def check(read_metrics, plan: Optional[dict], max_difference_pct: float) -> tuple:
    """The server's allocation against PLAN: (the record's kv_cache entry, why no actual was read or '', the
    comparison's warning or ''). READ_METRICS() returns the /metrics page or raises OSError."""
    predicted = predicted_from_plan(plan)
    actual, why = None, ""
    try:
        labels = parse_cache_config_info(read_metrics())
        if labels is None:
            why = "/metrics has no vllm:cache_config_info series"
        else:
            actual = actual_from_labels(labels, (predicted or {}).get("max_model_len"))
            why = "" if actual else "vllm:cache_config_info has no num_gpu_blocks yet"
    except OSError as exc:
        why = "cannot read /metrics: %s" % exc
    result = compare(predicted, actual, max_difference_pct)
    return result["entry"], why, result["warning"]
