# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validate our load generator against vLLM's own: the same load measured by both on one server, side by side.

  python3 benchmarks/compare_vllm_bench.py [--host onprem-lab-ws1] [--concurrency 1,4,8,16] [--num-prompts 64]
                                           [--output-len 64] [--rounds 3] [--json out.json]
  python3 benchmarks/compare_vllm_bench.py --base-url http://127.0.0.1:8000 --model /path/to/model \
      --served-model-name NAME [--vllm-python python3] [--client-cpus 0-1] [--waves 8]

Fairness: both clients run on the same machine against the same URL (on the lab: the lab host itself, against
http://127.0.0.1:8000); the same prompt text (a ShareGPT-layout file for vLLM's side; the server applies the chat
template for both), exactly --output-len tokens (ignore_eos), the same concurrency limit with every request
released at once (request rate inf), one warm-up request each, the same number of requests. The two clients take turns
for --rounds rounds in ABBA order (ours, vLLM's, vLLM's, ours, ...) and each figure is the median over a client's
rounds, so drift and a single stall favour neither side.

Lab mode (default): on a CPU lab the server and the clients would share the same cores, so by default (--isolate) the
server container is pinned to every CPU but the first for the run and each client to the first (`docker update
--cpuset-cpus`, `taskset`, `docker run --cpuset-cpus`); the server's own pinning is restored afterwards. `vllm bench
serve` runs in the lab's serving image (vLLM 0.32.0 CPU build) with `--entrypoint vllm`, the host's HF cache for the
tokenizer and HF_HUB_OFFLINE=1; the API key travels as an inherited environment variable, never as an argument.

Local mode (--base-url): both clients run on this machine against a server that is already up (a GPU host, say);
`--vllm-python` is the interpreter that has vLLM (its `vllm bench serve` code runs through vllm_bench_levels.py, vLLM
imported once for all levels), `--client-cpus` pins both clients with taskset (pin the server elsewhere yourself), the
key comes from OPENAI_API_KEY (none when unset).

A fast server finishes a level of 64 requests at concurrency 32 in half a second, two waves of requests; --waves N
gives each level at least N waves (N x concurrency requests), so a level lasts long enough to measure.

Prints, per concurrency: output tok/s and TTFT mean/p50/p99 of both and the relative difference (ours vs vLLM).
Exit status 1 when output tok/s or TTFT p50 differs by more than --tolerance percent (default 10); TTFT mean and p99
are printed, not gated (one client stall among 64 requests moves them by tens of percent on a shared 2-core machine).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOADGEN = REPO / "plugins" / "module_utils" / "vllm_loadgen.py"
METRICS = (("output_throughput", "output_throughput", "output tok/s"),
           ("ttft_mean_ms", "mean_ttft_ms", "TTFT mean ms"),
           ("ttft_p50_ms", "median_ttft_ms", "TTFT p50 ms"),
           ("ttft_p99_ms", "p99_ttft_ms", "TTFT p99 ms"))
# TTFT is gated on its median: on the 2-core lab one scheduler stall of a client among 64 requests moves the mean by
# tens of percent (seen mostly in vllm bench's heavier asyncio client); the mean and p99 are printed, not gated.
GATED = ("output_throughput", "ttft_p50_ms")
DEFAULT_PROMPT = ("Explain in three sentences what a KV cache is and why it limits how many requests a GPU serves "
                  "at once.")

# Runs on the lab host with its python3: the load generator's source is prepended, so nothing is installed there.
OURS_DRIVER = r'''
import json, os, sys
cfg = json.loads(sys.argv[1])
body = build_body(cfg["model"], cfg["prompt"], max_tokens=cfg["output_len"], ignore_eos=True)
out = {}
for level in cfg["concurrency"]:
    sweep = run_sweep(cfg["url"], os.environ.get("OPENAI_API_KEY", ""), body, [level], cfg["requests"][str(level)],
                      warmup=1)
    out[str(level)] = sweep["levels"][0] if sweep["levels"] else {"error": sweep["notes"]}
print("RESULT " + json.dumps(out))
'''


def sh(cmd, env=None, stdin=None, timeout=900):
    proc = subprocess.run(cmd, input=stdin, text=True, capture_output=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.exit("command failed (%s): %s\n%s" % (proc.returncode, " ".join(cmd[:6]), (proc.stderr or proc.stdout)[-3000:]))
    return proc.stdout


def api_key(host):
    line = sh(["docker", "exec", host, "cat", "/etc/onprem-vllm/vllm.env"]).strip()
    if not line.startswith("VLLM_API_KEY="):
        sys.exit("no VLLM_API_KEY in %s:/etc/onprem-vllm/vllm.env: deploy the lab first (make site)" % host)
    return line.split("=", 1)[1]


def cpu_split(count):
    """(client CPUs, server CPUs) of a host with `count` CPUs: the first for the clients, the rest for the server."""
    if count < 2:
        return None
    return "0", "1" if count == 2 else "1-%d" % (count - 1)


@contextmanager
def server_pinned(host, container, cpus, count):
    """Pin the server container to `cpus` for the duration; put its own setting (or all CPUs) back afterwards."""
    before = sh(["docker", "exec", host, "docker", "inspect", "-f", "{{.HostConfig.CpusetCpus}}", container]).strip()
    sh(["docker", "exec", host, "docker", "update", "--cpuset-cpus", cpus, container])
    try:
        yield
    finally:
        sh(["docker", "exec", host, "docker", "update", "--cpuset-cpus", before or "0-%d" % (count - 1), container])


def run_ours(host, env, args, levels, client_cpus):
    """Our load generator, run by the target machine's python3 (the lab host's, or this machine's in local mode)."""
    source = LOADGEN.read_text().replace("from __future__ import annotations", "")
    cfg = {"url": "%s/v1/chat/completions" % base_url(args), "model": args.served_model_name,
           "prompt": args.prompt, "output_len": args.output_len, "concurrency": levels,
           "requests": {str(level): requests_at(args, level) for level in levels}}
    pin = ["taskset", "-c", client_cpus] if client_cpus else []
    python = [*pin, sys.executable if args.base_url else "python3", "-", json.dumps(cfg)]
    prefix = [] if args.base_url else ["docker", "exec", "-i", "-e", "OPENAI_API_KEY", host]
    out = sh(prefix + python, env=env, stdin=source + "\n" + OURS_DRIVER)
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return {int(k): v for k, v in json.loads(line[7:]).items()}


def requests_at(args, level):
    """Requests at one concurrency level: --num-prompts, or --waves x level when that is more."""
    return max(args.num_prompts, args.waves * level)


def base_url(args):
    return args.base_url.rstrip("/") if args.base_url else "http://127.0.0.1:%d" % args.port


def sharegpt_rows(args, levels):
    """The prompt as a ShareGPT-layout file: the lab image has no pandas, which vLLM's `custom` (JSONL) dataset needs."""
    return json.dumps([{"conversations": [{"from": "human", "value": args.prompt}, {"from": "gpt", "value": "ok"}]}
                       for idx in range(max(requests_at(args, level) for level in levels) + 1)])


def vllm_bench_args(args, level, dataset, result_dir):
    return ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", base_url(args),
            "--model", args.model, "--served-model-name", args.served_model_name, "--dataset-name", "sharegpt",
            "--dataset-path", dataset, "--sharegpt-output-len", str(args.output_len), "--ignore-eos",
            "--num-prompts", str(requests_at(args, level)), "--max-concurrency", str(level), "--request-rate", "inf",
            "--num-warmups", "1", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--save-result", "--result-dir", result_dir, "--result-filename", "c%d.json" % level]


def run_vllm_local(env, args, levels, client_cpus):
    """vLLM's `vllm bench serve` code on this machine (local mode), all levels in one process, results read back from
    its JSON files."""
    pin = ["taskset", "-c", client_cpus] if client_cpus else []
    with tempfile.TemporaryDirectory(prefix="onprem-vllm-compare-") as work:
        dataset = os.path.join(work, "prompts.sharegpt")
        Path(dataset).write_text(sharegpt_rows(args, levels))
        runs = [vllm_bench_args(args, level, dataset, work) for level in levels]
        log = sh([*pin, args.vllm_python, str(REPO / "benchmarks" / "vllm_bench_levels.py"), json.dumps(runs)],
                 env=env, timeout=1800)
        return {level: json.loads(Path(work, "c%d.json" % level).read_text()) for level in levels}, log


def run_vllm(host, env, args, levels, client_cpus):
    if args.base_url:
        return run_vllm_local(env, args, levels, client_cpus)
    work = "/tmp/onprem-vllm-compare"
    sh(["docker", "exec", "-i", host, "sh", "-c", "mkdir -p %s && rm -f %s/*.json && cat > %s/prompts.sharegpt"
        % (work, work, work)], stdin=sharegpt_rows(args, levels))
    loop = " ; ".join("vllm bench serve %s || exit 1" % shlex.join(
        vllm_bench_args(args, level, "/data/prompts.sharegpt", "/data"))
        for level in levels)
    pin = ["--cpuset-cpus", client_cpus] if client_cpus else []
    log = sh(["docker", "exec", "-e", "OPENAI_API_KEY", host, "docker", "run", "--rm", "--network", "host", *pin,
              "-e", "OPENAI_API_KEY", "-e", "HF_HUB_OFFLINE=1", "-v", "/srv/hf-cache:/root/.cache/huggingface:ro",
              "-v", "%s:/data" % work, "--entrypoint", "bash", args.image, "-c", "set -e; " + loop], env=env,
             timeout=1800)
    out = {}
    for level in levels:
        out[level] = json.loads(sh(["docker", "exec", host, "cat", "%s/c%d.json" % (work, level)]))
    return out, log


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def rel(ours, theirs):
    if ours is None or not theirs:
        return None
    return (ours - theirs) / theirs * 100.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="onprem-lab-ws1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--image", default="vllm/vllm-openai:v0.32.0")
    parser.add_argument("--model", default="onprem-lab/tiny-qwen3")
    parser.add_argument("--served-model-name", default="qwen3-lab")
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--tolerance", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3, help="turns each client takes (ABBA order)")
    parser.add_argument("--container", default="vllm", help="the server's container on the lab host")
    parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                        help="let the server and the clients share every CPU")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--base-url", help="local mode: run both clients on this machine against this server URL")
    parser.add_argument("--vllm-python", default=sys.executable,
                        help="local mode: the Python interpreter that has vLLM (default: this one)")
    parser.add_argument("--waves", type=int, default=0,
                        help="at least this many waves of requests per level (waves x concurrency requests)")
    parser.add_argument("--client-cpus", help="local mode: CPU list both clients are pinned to (taskset -c)")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.rounds < 1:
        sys.exit("--rounds needs at least 1 (got %d)" % args.rounds)
    if not levels or min(levels) < 1:
        sys.exit("--concurrency needs levels of at least 1 (got %r)" % args.concurrency)
    if args.base_url:
        env = dict(os.environ)
        split = (args.client_cpus, "whatever its starter pinned it to") if args.client_cpus else None
        pinned = nullcontext()
    else:
        env = dict(os.environ, OPENAI_API_KEY=api_key(args.host))
        count = int(sh(["docker", "exec", args.host, "nproc", "--all"]).strip())
        split = cpu_split(count) if args.isolate else None
        pinned = server_pinned(args.host, args.container, split[1], count) if split else nullcontext()
    client_cpus = split[0] if split else None
    print("CPUs: " + ("clients on %s, server on %s" % split if split else "shared by the server and the clients"))
    ours_runs, vllm_runs = [], []
    with pinned:
        for turn in range(2 * args.rounds):
            ours_turn = turn % 4 in (0, 3)   # ABBA: ours, vLLM, vLLM, ours, ...
            print("round %d/%d: %s ..." % (turn // 2 + 1, args.rounds, "ours" if ours_turn else "vllm bench serve"),
                  flush=True)
            if ours_turn:
                ours_runs.append(run_ours(args.host, env, args, levels, client_cpus))
            else:
                vllm_runs.append(run_vllm(args.host, env, args, levels, client_cpus)[0])
            turn_figures = ours_runs[-1] if ours_turn else vllm_runs[-1]
            keys = METRICS[0][0 if ours_turn else 1], METRICS[2][0 if ours_turn else 1]
            # Each turn's figures as they come, so that a run cut short still leaves them in its log.
            print("  " + "  ".join("c%d: %.1f tok/s, TTFT p50 %.2f ms" % (
                level, turn_figures[level].get(keys[0]) or 0, turn_figures[level].get(keys[1]) or 0)
                for level in levels), flush=True)
    rows, worst = [], 0.0
    columns = ("concurrency", "metric", "ours", "vllm bench", "diff %", "ours runs", "vllm runs")
    header = "%-11s | %-13s | %10s %10s %8s | %-20s | %-20s" % columns
    print("\n" + header + "\n" + "-" * len(header))
    for level in levels:
        for ours_key, vllm_key, label in METRICS:
            ours_values = [run[level].get(ours_key) for run in ours_runs]
            vllm_values = [run[level].get(vllm_key) for run in vllm_runs]
            ours, ref = median(ours_values), median(vllm_values)
            diff = rel(ours, ref)
            if diff is not None and ours_key in GATED:
                worst = max(worst, abs(diff))
            rows.append({"concurrency": level, "metric": label, "ours": ours, "vllm_bench": ref, "diff_pct": diff,
                         "ours_runs": ours_values, "vllm_runs": vllm_values, "gated": ours_key in GATED})
            print("%-11d | %-13s | %10.2f %10.2f %8s | %-20s | %-20s" % (
                level, label, ours or 0, ref or 0, "-" if diff is None else "%+.1f" % diff,
                "/".join("%.1f" % v for v in ours_values if v is not None),
                "/".join("%.1f" % v for v in vllm_values if v is not None)))
        print("%-11s | prompt tok %s (ours) / %s (vllm total_input/completed); completed %s / %s per run" % (
            "", ours_runs[0][level].get("prompt_tokens_mean"),
            round(vllm_runs[0][level]["total_input_tokens"] / max(1, vllm_runs[0][level]["completed"]), 1),
            ours_runs[0][level].get("successful"), vllm_runs[0][level].get("completed")))
    print("\nlargest |difference| on output tok/s and TTFT p50 (medians of %d rounds): %.1f%% "
          "(tolerance %.0f%%)" % (args.rounds, worst, args.tolerance))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ours": ours_runs, "vllm_bench": vllm_runs,
                                               "settings": vars(args), "cpus": split}, indent=2, default=str))
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
