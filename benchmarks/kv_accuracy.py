# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Accuracy benchmark of onprem.vllm.kv_headroom against real vLLM startup logs.

    .venv/bin/python benchmarks/kv_accuracy.py                     # table + summary (+ vllm-wizard if installed)
    .venv/bin/python benchmarks/kv_accuracy.py --wizard-python /tmp/wiz/bin/python
    .venv/bin/python benchmarks/kv_accuracy.py --speed             # in-process time of one evaluation
    .venv/bin/python benchmarks/kv_accuracy.py --lab-log vllm.log --lab-config lab/model --cpu-kvcache-space-gib 1

Rows come from benchmarks/data/kv_startup_logs.yaml (each cites its source). Three comparisons:
  tokens     predicted KV tokens (blocks x block_size) from the logged available KV memory. The log rounds the
             memory to 0.01 GiB, so "exact" means the logged count lies in the range that rounding allows.
  available  predicted available KV memory from the logged weights, error as % of the budget util x total.
  verdict    fits / does not fit against what the log shows.
vllm-wizard 0.2.0 (PyPI) is driven through its Python API in its own venv, on the same rows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".collections"))

import yaml  # noqa: E402  (controller-side tool; PyYAML ships with ansible-core)

from ansible_collections.onprem.vllm.plugins.module_utils import kv_cache as kc  # noqa: E402
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import (  # noqa: E402
    load_model_shape,
    parse_config,
)

GIB = kc.GIB
DATA = os.path.join(ROOT, "benchmarks", "data", "kv_startup_logs.yaml")
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "models")
LOG_ROUNDING_GIB = 0.005  # vLLM prints GiB with two decimals

WIZARD_SNIPPET = r"""
import json, sys
from vllm_wizard.planning.planner import run_plan
from vllm_wizard.planning.memory import compute_kv_cache_memory
from vllm_wizard.models.metadata import load_model_metadata
from vllm_wizard.schemas.inputs import PlanRequest, ModelInput, HardwareInput, PolicyInput, WorkloadInput
out = []
for row in json.load(sys.stdin):
    try:
        try:
            meta = load_model_metadata(row["model"])
            model = row["model"]
        except ValueError:
            # not in its table of known sizes: give it the config.json directory, as its CLI allows
            meta = load_model_metadata(row["path"])
            model = row["path"]
        per_token = compute_kv_cache_memory(meta, context_len=1, concurrency=1)
        result = {"per_token_bytes": per_token}
        if row.get("total_gb"):
            req = PlanRequest(
                model=ModelInput(model=model, max_model_len=row["max_model_len"]),
                hardware=HardwareInput(gpu=row["gpu"], gpus=row["tp"], vram_gb=row["total_gb"],
                                       tensor_parallel_size=row["tp"]),
                policy=PolicyInput(gpu_memory_utilization=row["util"]),
                workload=WorkloadInput(concurrency=1))
            feas = run_plan(req).feasibility
            result.update(alloc_gib=feas.vram_target_alloc_gb, weights_gib=feas.weights_gb,
                          overhead_gib=feas.overhead_gb, fits=feas.fits)
        out.append(result)
    except Exception as exc:  # report, never fake
        out.append({"error": "%s: %s" % (type(exc).__name__, exc)})
print(json.dumps(out))
"""


def load_rows(path=DATA):
    with open(path, "r", encoding="utf-8") as handle:
        return yaml.safe_load(handle)["rows"]


def row_shape(row):
    if row.get("fixture"):
        return load_model_shape(os.path.join(FIXTURES, row["fixture"]))
    return parse_config(dict(row["config"]), source=row["model"])


def request_for(row, shape, **overrides):
    values = dict(
        shape=shape,
        gpu_memory_bytes=int(row["total_memory_gib"] * GIB) if row.get("total_memory_gib") else None,
        gpu_memory_utilization=row.get("gpu_memory_utilization"),
        tensor_parallel_size=row.get("tensor_parallel_size") or 1,
        pipeline_parallel_size=row.get("pipeline_parallel_size") or 1,
        max_model_len=row.get("max_model_len"),
        kv_cache_dtype=row.get("kv_cache_dtype") or "auto",
        max_num_batched_tokens=row.get("max_num_batched_tokens"),
        max_num_seqs=row.get("max_num_seqs"),
        vllm_version=str(row.get("vllm_version") or kc.DEFAULT_VLLM_VERSION),
        gpu_name=row.get("gpu") or "",
        enforce_eager="enforce-eager" in (row.get("version_note") or ""),
    )
    values.update(overrides)
    return kc.PlanRequest(**values)


def logged_tokens(row, block_size=16):
    logged = row["logged"]
    if logged.get("kv_cache_tokens"):
        return logged["kv_cache_tokens"]
    if logged.get("num_gpu_blocks"):
        return logged["num_gpu_blocks"] * block_size
    return None


def tokens_check(row, shape):
    """Predicted tokens from the logged available memory: (predicted, logged, rel error, exact within rounding)."""
    logged = row["logged"]
    truth = logged_tokens(row)
    if logged.get("available_kv_gib") is None or truth is None:
        return None
    predicted = {}
    for label, delta in (("low", -LOG_ROUNDING_GIB), ("mid", 0.0), ("high", LOG_ROUNDING_GIB)):
        avail = int((logged["available_kv_gib"] + delta) * GIB)
        predicted[label] = kc.plan(request_for(row, shape, available_kv_cache_bytes=avail,
                                               gpu_memory_bytes=None)).kv_cache_tokens
    exact = predicted["low"] <= truth <= predicted["high"]
    return predicted["mid"], truth, (predicted["mid"] - truth) / truth, exact


def available_check(row, shape, weights_from_log=True):
    """Predicted available KV memory and verdict; error as a fraction of the budget util x total."""
    logged = row["logged"]
    if not row.get("total_memory_gib") or logged.get("available_kv_gib") is None:
        return None
    if weights_from_log and logged.get("weights_gib") is None:
        return None
    overrides = {}
    if weights_from_log:
        overrides["weights_bytes_per_gpu"] = int(logged["weights_gib"] * GIB)
    result = kc.plan(request_for(row, shape, **overrides))
    budget = result.budget_bytes
    error = (result.available_kv_cache_bytes - logged["available_kv_gib"] * GIB) / budget
    return result.available_kv_cache_bytes / GIB, error, result.fits


def run_wizard(rows, wizard_python):
    """vllm-wizard's numbers per row, or None when it is not installed."""
    if not wizard_python or not os.path.exists(wizard_python):
        return None
    payload = []
    config_dirs = tempfile.mkdtemp(prefix="kv_accuracy_")
    for row in rows:
        total = row.get("total_memory_gib")
        if row.get("fixture"):
            path = os.path.join(FIXTURES, row["fixture"])
        else:
            path = os.path.join(config_dirs, row["id"])
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as handle:
                json.dump(row["config"], handle)
        payload.append({"model": row["model"], "path": path, "gpu": row.get("gpu") or "Unknown GPU",
                        "tp": row.get("tensor_parallel_size") or 1, "max_model_len": row.get("max_model_len"),
                        "util": row.get("gpu_memory_utilization") or 0.9,
                        # its --vram-gb is read as GiB x 1024 MiB
                        "total_gb": total})
    proc = subprocess.run([wizard_python, "-c", WIZARD_SNIPPET], input=json.dumps(payload), capture_output=True,
                          text=True, check=False, timeout=300)
    if proc.returncode != 0:
        return [{"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}] * len(rows)
    return json.loads(proc.stdout)


def pct(value):
    return "   -   " if value is None else "%+6.2f%%" % (100 * value)


def summarize(label, errors):
    if not errors:
        return "%s: no rows" % label
    absolute = [abs(e) for e in errors]
    return "%s: n=%d median %.2f%% worst %.2f%%" % (
        label, len(errors), 100 * statistics.median(absolute), 100 * max(absolute))


def benchmark(wizard_python):
    rows = load_rows()
    wizard = run_wizard(rows, wizard_python)
    token_errors, token_exact, avail_errors, avail_pred_errors, verdict_miss = [], [], [], [], []
    wiz_token_errors, wiz_avail_errors, wiz_verdict_miss, wiz_notes = [], [], [], []
    print("%-30s %-14s %3s | %9s %9s %8s %5s | %8s %8s %8s | %7s | %8s %8s" % (
        "row", "vllm/gpu", "tp", "tok pred", "tok log", "tok err", "exact", "avail", "err/bud", "predW",
        "verdict", "wiz tok", "wiz av"))
    for index, row in enumerate(rows):
        shape = row_shape(row)
        tokens = tokens_check(row, shape) if "tokens" in row["tests"] else None
        avail = available_check(row, shape) if "available" in row["tests"] else None
        avail_pred = available_check(row, shape, weights_from_log=False) if "available" in row["tests"] else None
        verdict = ""
        if tokens:
            token_errors.append(tokens[2])
            token_exact.append(tokens[3])
        if avail:
            avail_errors.append(avail[1])
        if avail_pred:
            avail_pred_errors.append(avail_pred[1])
        if "verdict" in row["tests"] and avail:
            ok = avail[2] == row["logged"]["fits"]
            verdict = "ok" if ok else "WRONG"
            if not ok:
                verdict_miss.append(row["id"])
        wiz_tok = wiz_av = None
        if wizard is not None:
            wiz = wizard[index]
            if "error" in wiz:
                wiz_notes.append("%s: vllm-wizard failed: %s" % (row["id"], wiz["error"]))
            else:
                truth = logged_tokens(row)
                if tokens and truth and row["logged"].get("available_kv_gib") is not None:
                    tp = row.get("tensor_parallel_size") or 1
                    # its KV model is whole-model bytes per token (x1.15 fragmentation) over the TP group's memory
                    wiz_tok = (row["logged"]["available_kv_gib"] * GIB * tp / wiz["per_token_bytes"] - truth) / truth
                    wiz_token_errors.append(wiz_tok)
                if avail and "alloc_gib" in wiz:
                    wiz_available = wiz["alloc_gib"] - wiz["weights_gib"] - wiz["overhead_gib"]
                    budget = row["gpu_memory_utilization"] * row["total_memory_gib"]
                    wiz_av = (wiz_available - row["logged"]["available_kv_gib"]) / budget
                    wiz_avail_errors.append(wiz_av)
                    if "verdict" in row["tests"] and wiz["fits"] != row["logged"]["fits"]:
                        wiz_verdict_miss.append(row["id"])
        print("%-30s %-14s %3s | %9s %9s %8s %5s | %8s %8s %8s | %7s | %8s %8s" % (
            row["id"][:30], ("%s/%s" % (row.get("vllm_version"), row.get("gpu") or "?"))[:14],
            row.get("tensor_parallel_size"),
            tokens[0] if tokens else "-", tokens[1] if tokens else "-", pct(tokens[2]) if tokens else pct(None),
            ("yes" if tokens[3] else "no") if tokens else "-",
            "%.2f" % avail[0] if avail else "-", pct(avail[1]) if avail else pct(None),
            pct(avail_pred[1]) if avail_pred else pct(None), verdict or "-", pct(wiz_tok), pct(wiz_av)))
    print()
    print("Sources: " + "; ".join("%s <%s>" % (r["id"], r["source"]) for r in rows))
    print()
    print("onprem.vllm.kv_headroom")
    print("  " + summarize("KV tokens given logged available memory", token_errors)
          + "; exact to the block (within log rounding): %d/%d" % (sum(token_exact), len(token_exact)))
    print("  " + summarize("available KV memory given logged weights, % of util x total", avail_errors))
    print("  " + summarize("available KV memory fully predicted (weights from config), % of budget",
                           avail_pred_errors))
    print("  verdict mismatches: %d %s" % (len(verdict_miss), verdict_miss))
    print("vllm-wizard 0.2.0")
    if wizard is None:
        print("  not run: pass --wizard-python (a venv with vllm-wizard==0.2.0, see docs/kv_headroom.md)")
    else:
        print("  " + summarize("KV tokens given logged available memory", wiz_token_errors))
        print("  " + summarize("available KV memory (its own weights; it takes no weights input), % of budget",
                               wiz_avail_errors))
        print("  verdict mismatches: %d %s" % (len(wiz_verdict_miss), wiz_verdict_miss))
        for note in wiz_notes:
            print("  " + note)
    print("Rows: %d; tokens-testable %d, available-testable %d. Rows without a number in their log are not scored "
          "on it." % (len(rows), len(token_errors), len(avail_errors)))


def speed(runs=2000):
    shape = load_model_shape(os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8"))
    request = kc.PlanRequest(shape=shape, gpu_memory_bytes=24 * GIB, tensor_parallel_size=2, max_model_len=32768,
                             min_concurrency=4)
    samples = []
    for _run in range(runs):
        start = time.perf_counter()
        kc.plan(request)
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    load_model_shape(os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8"))
    load = time.perf_counter() - start
    print("one evaluation (plan incl. suggestions): median %.3f ms, p99 %.3f ms over %d runs; reading config.json "
          "%.3f ms" % (1e3 * statistics.median(samples), 1e3 * sorted(samples)[int(0.99 * runs)], runs, 1e3 * load))


LAB_LINE = re.compile(r"(CPU|GPU) KV cache size: ([\d,]+) tokens")


def lab_check(log_path, config_path, space_gib, block_size):
    with open(log_path, "r", encoding="utf-8", errors="replace") as handle:
        matches = LAB_LINE.findall(handle.read())
    if not matches:
        print("lab: no 'CPU KV cache size: N tokens' line in %s" % log_path)
        return 1
    logged = int(matches[-1][1].replace(",", ""))
    result = kc.plan(kc.PlanRequest(shape=load_model_shape(config_path), device="cpu", block_size=block_size,
                                    cpu_kv_cache_space_bytes=int(space_gib * GIB)))
    status = "EXACT" if result.kv_cache_tokens == logged else "MISMATCH"
    print("lab CPU backend: predicted %d tokens, logged %d tokens: %s" % (result.kv_cache_tokens, logged, status))
    return 0 if status == "EXACT" else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wizard-python", default="/tmp/wiz/bin/python",
                        help="python of a venv with vllm-wizard==0.2.0 (skipped when missing)")
    parser.add_argument("--speed", action="store_true", help="time one in-process evaluation")
    parser.add_argument("--lab-log", help="a vLLM CPU server log holding 'CPU KV cache size: N tokens'")
    parser.add_argument("--lab-config", help="the lab model's config.json or checkpoint dir")
    parser.add_argument("--cpu-kvcache-space-gib", type=float, default=4.0, help="VLLM_CPU_KVCACHE_SPACE of the lab")
    parser.add_argument("--lab-block-size", type=int, default=16, help="--block-size the lab server used")
    args = parser.parse_args(argv)
    if args.lab_log:
        if not args.lab_config:
            parser.error("--lab-log needs --lab-config")
        return lab_check(args.lab_log, args.lab_config, args.cpu_kvcache_space_gib, args.lab_block_size)
    if args.speed:
        speed()
        return 0
    benchmark(args.wizard_python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
