# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What token accounting costs a real vLLM server on a GPU (`bash benchmarks/gpu_compare/run.sh usage-cost`).

Two vLLM servers side by side on the lent GPU, the same model and flags: "guarded" with the collection's bearer-key
middleware as roles/vllm_server deploys it, "counted" with the usage middleware and --enable-force-include-usage too
(roles/vllm_server/files). The same requests go to each, in interleaved rounds (which server goes first alternates),
from CPUs the servers do not use: chat completions plain and streamed (a ~200-token prompt, 64 tokens generated,
ignore_eos so every answer is as long). Prints and writes per kind and server the latency p50 and p99 (the whole
answer), the difference, and the API server processes' resident memory before and after; the counted server's
ledger must hold exactly the requests it answered.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
FILES = os.path.join(ROOT, "roles", "vllm_server", "files")
WORDS = ("alpha", "beta", "gamma", "river", "stone", "cloud", "seven", "north", "paper", "light", "green", "table")


def _rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid, encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _start(name, model, port, cpus, key_file, usage_dir, out):
    args = ["taskset", "-c", cpus, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", "qwen3-gpu", "--port", str(port), "--max-model-len", "4096",
            "--gpu-memory-utilization", "0.3", "--enforce-eager"]
    if name == "counted":
        args += ["--middleware", "onprem_vllm_usage.UsageMiddleware", "--enable-force-include-usage"]
    args += ["--middleware", "onprem_vllm_auth.BearerKeyMiddleware"]
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "") + ":" + FILES,
               ONPREM_VLLM_API_KEY_FILE=key_file, ONPREM_VLLM_USAGE_DIR=usage_dir,
               ONPREM_VLLM_USAGE_MODEL="qwen3-gpu")
    log = open(os.path.join(out, "server-%s.log" % name), "wb")  # pylint: disable=consider-using-with
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)  # pylint: disable=consider-using-with


def _healthy(port):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _one(port, key, kind, prompt, tokens):
    body = {"model": "qwen3-gpu", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": kind == "stream"}
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Authorization": "Bearer " + key, "Content-Type": "application/json",
                  "X-Onprem-Client": "bench"})
    answer = conn.getresponse()
    data = answer.read()
    elapsed = time.perf_counter() - started
    conn.close()
    if answer.status != 200:
        raise RuntimeError("%d %s" % (answer.status, data[:200]))
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=48, help="per round, kind and server")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="usage-cost-")
    key = secrets.token_hex(16)
    key_file = os.path.join(work, "api-key")
    with open(key_file, "w", encoding="ascii") as handle:
        handle.write(key + "\n")
    usage_dir = os.path.join(work, "usage")
    os.makedirs(usage_dir)
    servers = {"guarded": (8001, "2-8"), "counted": (8002, "9-15")}
    procs = {name: _start(name, args.model, port, cpus, key_file, usage_dir, args.out)
             for name, (port, cpus) in servers.items()}
    try:
        deadline = time.monotonic() + 420
        while not all(_healthy(port) for port, _cpus in servers.values()):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise SystemExit("a server did not start: see %s/server-*.log" % args.out)
            time.sleep(1)
        rng = random.Random(7)
        prompts = [" ".join(rng.choice(WORDS) for _word in range(200)) for _prompt in range(64)]
        rss_before = {name: _rss_kib(p.pid) for name, p in procs.items()}
        times = {kind: {name: [] for name in servers} for kind in ("chat", "stream")}
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            for kind in times:  # warm-up: each server's first requests of this kind
                for name, (port, _cpus) in servers.items():
                    list(pool.map(lambda n, p=port, k=kind: _one(p, key, k, prompts[n % 64], args.tokens),
                                  range(args.concurrency)))
            for number in range(args.rounds):
                order = list(servers) if number % 2 == 0 else list(reversed(list(servers)))
                for kind in times:
                    for name in order:
                        port = servers[name][0]
                        times[kind][name] += pool.map(
                            lambda n, p=port, k=kind: _one(p, key, k, prompts[n % 64], args.tokens),
                            range(args.requests))
        rss_after = {name: _rss_kib(p.pid) for name, p in procs.items()}
        with open(os.path.join(usage_dir, "usage.jsonl"), "rb") as handle:
            ledger = [json.loads(line) for line in handle.read().splitlines()]
        counted_requests = args.rounds * args.requests * len(times) + args.concurrency * len(times)
        result = {"model": args.model, "rounds": args.rounds, "requests_per_round": args.requests,
                  "concurrency": args.concurrency, "tokens": args.tokens,
                  "ledger_requests": sum(entry["requests"] for entry in ledger),
                  "ledger_completion_tokens": sum(entry["completion"] for entry in ledger),
                  "expected_requests": counted_requests,
                  "rss_kib_before": rss_before, "rss_kib_after": rss_after, "kinds": {}}
        for kind, by_server in times.items():
            row = {}
            for name, values in by_server.items():
                ordered = sorted(values)
                row[name] = {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 2),
                             "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2)}
            row["added_p50_ms"] = round(row["counted"]["p50_ms"] - row["guarded"]["p50_ms"], 2)
            row["added_p99_ms"] = round(row["counted"]["p99_ms"] - row["guarded"]["p99_ms"], 2)
            result["kinds"][kind] = row
        with open(os.path.join(args.out, "usage-cost.json"), "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2, sort_keys=True)
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0 if result["ledger_requests"] == counted_requests else 1
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
