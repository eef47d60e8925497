# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse the kv_startups.sh logs into runs.yaml, with kv_cache.py's prediction beside vLLM's own numbers.

    .venv/bin/python benchmarks/gpu_compare/parse_kv_startups.py DATA_DIR > DATA_DIR/runs.yaml
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.onprem.vllm.plugins.module_utils import kv_cache as kc  # noqa: E402
from ansible_collections.onprem.vllm.plugins.module_utils.model_config import parse_config  # noqa: E402

GIB = kc.GIB
CONFIGS = os.path.join(ROOT, "benchmarks", "gpu_compare", "model-configs")


def num(text):
    return float(text.replace(",", ""))


PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "initial_free_gib": r"Initial free memory: ([\d.]+) GiB; Requested memory",
    "requested_gib": r"Requested memory: [\d.]+ \(util\), ([\d.]+) GiB",
    "profile_non_kv_gib": r"Total non KV cache memory: ([\d.]+)GiB",
    "profile_torch_peak_increase_gib": r"torch peak memory increase: ([\d.]+)GiB",
    "profile_non_torch_increase_gib": r"non-torch forward increase memory: ([\d.]+)GiB",
    "cudagraph_estimate_gib": r"Estimated CUDA graph memory: ([\d.]+) GiB total",
    "available_kv_gib": r"Available KV cache memory: ([-\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "graph_capture_gib": r"Graph capturing finished in \d+ secs, took ([-\d.]+) GiB",
    "cudagraph_pool_actual_gib": r"CUDA graph pool memory: ([-\d.]+) GiB \(actual\)",
    "cudagraph_pool_estimated_gib": r"GiB \(actual\), ([-\d.]+) GiB \(estimated\)",
    "total_memory_gib": r"Free memory on device \([\d.]+/([\d.]+) GiB\)",
    "free_at_start_gib": r"Free memory on device \(([\d.]+)/[\d.]+ GiB\)",
    "actual_weight_gib": r"Actual usage is ([\d.]+) GiB for weight",
    "actual_peak_activation_gib": r"GiB for weight, ([\d.]+) GiB for peak activation",
    "actual_non_torch_gib": r"peak activation, ([\d.]+) GiB for non-torch memory",
    "actual_cudagraph_gib": r"non-torch memory, and ([\d.]+) GiB for CUDAGraph memory",
    "suggested_kv_cache_memory_bytes": r"Replace gpu_memory_utilization config with `--kv-cache-memory=(\d+)`",
    "max_num_batched_tokens": r"max_num_batched_tokens=(\d+)",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "encoder_budget_tokens": r"Encoder cache will be initialized with a budget of (\d+) tokens",
    "encoder_profile_items": r"and profiled with (\d+) \w+ items of the maximum feature size",
    "attention_block_size": r"Setting attention block size to (\d+) tokens",
    "mamba_page_padding_pct": r"Padding mamba page size by ([\d.]+)%",
    "padding_layers": r"Add (\d+) padding layers",
    "compile_s": r"torch.compile took ([\d.]+) s in total",
}
INT_FIELDS = {"kv_cache_tokens", "suggested_kv_cache_memory_bytes", "max_num_batched_tokens", "encoder_budget_tokens",
              "encoder_profile_items", "attention_block_size", "padding_layers"}


def parse_log(text):
    logged = {}
    for key, pattern in PATTERNS.items():
        found = re.findall(pattern, text)
        if found:
            value = num(found[-1])
            logged[key] = int(value) if key in INT_FIELDS else value
    return logged


def flag(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def gpu_of(text):
    """The GPU named by kv_startups.sh's "# gpu before: NAME, driver, ..." line (the H200 when a log has none)."""
    found = re.search(r"^# gpu before: ([^,]+),", text, re.M)
    return found.group(1).strip() if found else "NVIDIA H200"


def predict(model, argv, logged, gpu_name="NVIDIA H200"):
    with open(os.path.join(CONFIGS, model, "config.json")) as handle:
        shape = parse_config(json.load(handle), source=model)
    total = logged.get("total_memory_gib")
    if total is None:
        return None, None
    base = dict(shape=shape, gpu_memory_bytes=int(total * GIB),
                gpu_memory_utilization=float(flag(argv, "--gpu-memory-utilization")),
                max_model_len=int(flag(argv, "--max-model-len")),
                kv_cache_dtype=flag(argv, "--kv-cache-dtype", "auto"),
                max_num_batched_tokens=int(flag(argv, "--max-num-batched-tokens", 0)) or None,
                max_num_seqs=int(flag(argv, "--max-num-seqs", 0)) or None,
                vllm_version="0.26.0", gpu_name=gpu_name, enforce_eager="--enforce-eager" in argv)
    out = {}
    plan = kc.plan(kc.PlanRequest(**base))
    out["config_weights"] = plan
    if logged.get("weights_gib") is not None:
        out["logged_weights"] = kc.plan(kc.PlanRequest(**{**base, "weights_bytes_per_gpu": int(logged["weights_gib"] * GIB)}))
    if logged.get("available_kv_gib") is not None:
        tok = {}
        for label, delta in (("low", -0.005), ("mid", 0.0), ("high", 0.005)):
            avail = int((logged["available_kv_gib"] + delta) * GIB)
            tok[label] = kc.plan(kc.PlanRequest(**{**base, "available_kv_cache_bytes": avail, "gpu_memory_bytes": None})).kv_cache_tokens
        out["tokens"] = tok
    return out, shape


def r2(x):
    return None if x is None else round(x, 2)


def main(data_dir):
    runs_tsv = {}
    tsv = os.path.join(data_dir, "runs.tsv")
    if os.path.exists(tsv):
        for line in open(tsv).read().splitlines()[1:]:
            parts = line.split("\t")
            runs_tsv[parts[0]] = parts[1:]
    logs = sorted(glob.glob(os.path.join(data_dir, "*.log")))
    gpus = sorted({gpu_of(open(path, errors="replace").read()) for path in logs})
    if gpus != ["NVIDIA H200"]:  # a folder of another GPU: its README.md says how it was recorded
        print("# vLLM 0.26.0 startups on %s (dummy weights, config.json cut to a few layers); how they were recorded,"
              % " and ".join(gpus))
        print("# what ran and what did not: README.md beside this file. Written by kv_startups.sh; each <id>.log")
        print("# starts with its exact command. `logged`: numbers copied from vLLM's own log lines (GiB with vLLM's two")
        print("# decimals); a number the log does not have is absent. `predicted`: plugins/module_utils/kv_cache.py of")
        print("# the commit this file was written at, as the parser builds the request (vllm_version 0.26.0, the")
        print("# logged GPU, total = vLLM's logged device total; no --limit-mm-per-prompt or runner override), once")
        print("# with weights from config.json and once with the logged weights; the held-out comparison a plan makes")
        print("# is benchmarks/kv_accuracy.py --h100. Load logs (load-*) are not startups and are left out here.")
        print("runs:")
        return emit_runs(logs)
    print("# vLLM 0.26.0 startups on one lent NVIDIA H200 (dummy weights, real config.json), 2026-12-01.")
    print("# Written by kv_startups.sh (benchmarks/gpu_compare); each <id>.log starts with its exact command.")
    print("# `logged`: numbers copied from vLLM's own log lines (GiB with vLLM's two decimals); a number the log")
    print("# does not have is absent. `predicted`: plugins/module_utils/kv_cache.py as committed on 2026-12-01")
    print("# (vllm_version 0.26.0, gpu_name 'NVIDIA H200', total = vLLM's logged device total), once with weights from")
    print("# config.json and once with the logged weights; tokens_from_logged_available feeds the logged available")
    print("# KV memory (+-0.005 GiB for the log's rounding) through the block arithmetic.")
    print("# Setup: vLLM 0.26.0 wheel + deps packed by benchmarks/gpu_compare/pack.sh (parts 1-3, MoE kernels included),")
    print("# image torch 2.11.0+cu130, driver 580.159.04, H200 143771 MiB (vLLM: 139.8 GiB total, 139.29 GiB free at")
    print("# start), TP=1, api_server defaults otherwise (8192 batched tokens, 1024 seqs, block 16), VLLM_LOGGING_LEVEL=DEBUG.")
    print("# Not in the pack, so not what a full install would run: FlashInfer (VLLM_USE_FLASHINFER_SAMPLER=0: PyTorch")
    print("# sampler), DeepGEMM (the MoE run used vLLM's TRITON fp8 MoE backend and CUTLASS block-FP8 linear kernels).")
    print("# Tokenizer: the lab's tiny-qwen3 tokenizer (4096 tokens) in every model folder; memory follows config.json's")
    print("# vocab_size, the tokenizer only has to load. Runs follow one another on the same machine, so torch.compile's")
    print("# cache is warm for a model compiled before (see torch_compile per run).")
    print("# Found in these logs: dense models run vLLM 0.26's model runner V2, whose profile_cudagraph_memory() returns 0,")
    print("# so CUDA graphs (0.5-1.9 GiB, logged after capture) are NOT subtracted from the budget; the MoE model runs")
    print("# model runner V1, which subtracts its CUDA-graph estimate (0.84 GiB). derived.cudagraph_subtracted_in_budget_gib")
    print("# shows it per run.")
    print("# Planned but not run (device time): q30moe-fp8-u090-32k-eager, q8b-u090-32k-mnbt16k (--max-num-batched-tokens")
    print("# 16384), q8b-u090-32k-seqs256 (--max-num-seqs 256), q32b-u095-40k-eager (kv_startups.sh list).")
    print("runs:")
    return emit_runs(logs)


def emit_runs(logs):
    for path in logs:
        run_id = os.path.basename(path)[:-4]
        if run_id.startswith("load-"):  # kv_startups.sh LOAD=: a pinned pool under load, not a profiled startup
            continue
        text = open(path, errors="replace").read()
        command = re.search(r"^# command: (.*)$", text, re.M).group(1)
        argv = command.split()
        model = flag(argv, "--served-model-name")
        logged = parse_log(text)
        ended = re.search(r"^# ended: (\S+) after (\d+)s \(exit status (\S+)\)", text, re.M)
        errors = [l.strip()[:300] for l in text.splitlines()
                  if re.search(r"( ERROR |Traceback|out of memory)", l)][:3]
        runner = ("v2 (vllm/v1/worker/gpu/model_runner.py)" if "v1/worker/gpu/model_runner.py" in text
                  else "v1 (vllm/v1/worker/gpu_model_runner.py)")
        if "--enforce-eager" in argv:
            compile_state = "none (eager)"
        elif "Directly load the compiled graph" in text:
            compile_state = "loaded from this machine's cache (same model compiled in an earlier run)"
        else:
            compile_state = "compiled in this run (cold cache)"
        print("  - id: %s" % run_id)
        print("    model: %s" % model)
        print("    config: benchmarks/gpu_compare/model-configs/%s/config.json" % model)
        print("    log: %s.log" % run_id)
        print("    command: %s" % json.dumps(command))
        flags = [a for a in argv if a.startswith("--") and a not in (
            "--model", "--served-model-name", "--port", "--load-format")]
        print("    flags: %s" % json.dumps(" ".join(
            "%s %s" % (f, flag(argv, f)) if f not in ("--enforce-eager",) else f for f in flags)))
        print("    gpu_memory_utilization: %s" % flag(argv, "--gpu-memory-utilization"))
        print("    max_model_len: %s" % flag(argv, "--max-model-len"))
        print("    kv_cache_dtype: %s" % flag(argv, "--kv-cache-dtype", "auto"))
        print("    enforce_eager: %s" % ("true" if "--enforce-eager" in argv else "false"))
        print("    model_runner: %s" % runner)
        print("    torch_compile: %s" % compile_state)
        if ended:
            print("    ended: %s   # logged = stopped after vLLM's memory split line; exited = vLLM exited by itself"
                  % ended.group(1))
            print("    startup_seconds: %s" % ended.group(2))
        print("    logged:")
        for key in PATTERNS:
            if key in logged:
                print("      %s: %s" % (key, logged[key]))
        if all(k in logged for k in ("requested_gib", "actual_weight_gib", "actual_peak_activation_gib",
                                     "actual_non_torch_gib", "available_kv_gib")):
            rest = (logged["requested_gib"] - logged["actual_weight_gib"] - logged["actual_peak_activation_gib"]
                    - logged["actual_non_torch_gib"] - logged["available_kv_gib"])
            print("    derived:")
            print("      cudagraph_subtracted_in_budget_gib: %.2f   # requested - weight - peak - non-torch - "
                  "available (0 = graphs outside the budget)" % rest)
        if errors:
            print("    errors:")
            for e in errors:
                print("      - %s" % json.dumps(e))
        pred, shape = predict(model, argv, logged, gpu_of(text))
        if pred:
            budget = pred["config_weights"].budget_bytes
            print("    predicted:")
            for label in ("config_weights", "logged_weights"):
                if label not in pred:
                    continue
                p = pred[label]
                print("      %s:" % label)
                print("        weights_gib: %.2f" % (p.weights_bytes_per_gpu / GIB))
                print("        activation_peak_gib: %.2f" % (p.activation_peak_bytes / GIB))
                print("        non_torch_gib: %.2f" % (p.non_torch_bytes / GIB))
                print("        cudagraph_gib: %.2f" % (p.cudagraph_bytes / GIB))
                print("        available_kv_gib: %.2f" % (p.available_kv_cache_bytes / GIB))
                print("        kv_cache_tokens: %d" % p.kv_cache_tokens)
                print("        max_concurrency: %.2f" % p.max_concurrency)
                print("        fits: %s" % str(p.fits).lower())
                if logged.get("available_kv_gib") is not None:
                    err = (p.available_kv_cache_bytes - logged["available_kv_gib"] * GIB) / budget
                    print("        available_error_pct_of_budget: %+.2f" % (100 * err))
            if "tokens" in pred:
                t = pred["tokens"]
                exact = logged.get("kv_cache_tokens") is not None and t["low"] <= logged["kv_cache_tokens"] <= t["high"]
                print("      tokens_from_logged_available: {low: %d, mid: %d, high: %d, exact_within_rounding: %s}"
                      % (t["low"], t["mid"], t["high"], str(exact).lower()))
            print("      bytes_per_token: %d" % pred["config_weights"].kv_bytes_per_token)
            print("      budget_gib: %.2f" % (budget / GIB))


if __name__ == "__main__":
    main(sys.argv[1])
