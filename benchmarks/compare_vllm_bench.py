# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validate our load generator against vLLM's own: the same load measured by both on one server, side by side.

  python3 benchmarks/compare_vllm_bench.py [--host onprem-lab-ws1] [--concurrency 1,4,8,16] [--num-prompts 64]
      [--output-len 64] [--output-len-range-ratio 0.5] [--distinct-prompts] [--prompt TEXT] [--prompt-repeat 20]
      [--rounds 3] [--json F]
  python3 benchmarks/compare_vllm_bench.py --base-url http://127.0.0.1:8000 --model /path/to/model \
      --served-model-name NAME [--vllm-python python3] [--client-cpus 0-1] [--waves 8]

Fairness: both clients run on the same machine against the same URL (on the lab: the lab host itself, against
http://127.0.0.1:8000) and send the same requests: request i has the same prompt text (a ShareGPT-layout file for
vLLM's side, read in file order; the server applies the chat template for both) and asks for the same number of
tokens (ignore_eos), with the same concurrency limit, every request released at once (request rate inf), one warm-up
request each and the same number of requests; the output token totals are checked to match. The clients take turns
level by level, --rounds each, in ABBA order (ours, vLLM's, vLLM's, ours, ...), and each figure is the median over a
client's turns, so the server's drift and a single stall favour neither side.

The load (why the options): by default every request has the same prompt and exactly --output-len tokens. Requests
then finish in the same engine step and come back as one burst; how a client's burst splits across engine steps sets
every time to first token, so the two clients' TTFTs differ by how fast each resubmits, not by how each measures.
--output-len-range-ratio R draws request i's length from [L(1-R), L(1+R)] (seeded), so requests finish apart.
Identical prompts are served from vLLM's prefix cache; --distinct-prompts puts the turn's and the request's number
first, so every prompt is prefilled in full and a TTFT is mostly server work, not client overhead.

Lab mode (default): on a CPU lab the server and the clients would share the same cores, so by default (--isolate) the
server container is pinned to every CPU but the first for the run and each client to the first (`docker update
--cpuset-cpus`, `taskset`, `docker run --cpuset-cpus`); the server's own pinning is restored afterwards. `vllm bench
serve`'s code runs in the lab's serving image (vLLM 0.32.0 CPU build), one container for the whole run
(vllm_bench_levels.py, handed one level at a time), with the host's HF cache for the tokenizer and HF_HUB_OFFLINE=1;
the API key travels as an inherited environment variable, never as an argument.

Local mode (--base-url): both clients run on this machine against a server that is already up (a GPU host, say);
`--vllm-python` is the interpreter that has vLLM (its `vllm bench serve` code runs through vllm_bench_levels.py, vLLM
imported once for the run), `--client-cpus` pins both clients with taskset (pin the server elsewhere yourself), the
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
import random
import secrets
import subprocess
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from vllm_bench_levels import DONE, READY   # this script's own folder (benchmarks/) is first on sys.path

REPO = Path(__file__).resolve().parent.parent
LOADGEN = REPO / "plugins" / "module_utils" / "vllm_loadgen.py"
LEVELS_SCRIPT = REPO / "benchmarks" / "vllm_bench_levels.py"
METRICS = (("output_throughput", "output_throughput", "output tok/s"),
           ("ttft_mean_ms", "mean_ttft_ms", "TTFT mean ms"),
           ("ttft_p50_ms", "median_ttft_ms", "TTFT p50 ms"),
           ("ttft_p99_ms", "p99_ttft_ms", "TTFT p99 ms"))
# TTFT is gated on its median: on the 2-core lab one scheduler stall of a client among 64 requests moves the mean by
# tens of percent (seen mostly in vllm bench's heavier asyncio client); the mean and p99 are printed, not gated.
GATED = ("output_throughput", "ttft_p50_ms")
SEED = 20261130
MIN_OUTPUT_LEN = 4   # vLLM's ShareGPT loader drops rows whose answer is shorter
DEFAULT_PROMPT = ("Explain in three sentences what a KV cache is and why it limits how many requests a GPU serves "
                  "at once.")

# Runs on the lab host with its python3: the load generator's source is prepended, so nothing is installed there.
OURS_DRIVER = r'''
import json, os
cfg = json.loads(CFG)
body = [build_body(cfg["model"], prompt, max_tokens=length, ignore_eos=True)
        for prompt, length in zip(cfg["prompts"], cfg["output_lens"])]
sweep = run_sweep(cfg["url"], os.environ.get("OPENAI_API_KEY", ""), body, [cfg["concurrency"]], cfg["requests"],
                  warmup=1)
print("RESULT " + json.dumps(sweep["levels"][0] if sweep["levels"] else {"error": sweep["notes"]}))
'''


def sh(cmd, env=None, stdin=None, timeout=900):
    proc = subprocess.run(cmd, input=stdin, text=True, capture_output=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.exit("command failed (%s): %s\n%s" % (proc.returncode, " ".join(cmd[:6]), (proc.stderr or proc.stdout)[-3000:]))
    return proc.stdout


def api_key(host):
    """A key the server accepts: its key file holds one per line (two during a rotation), each accepted."""
    keys = sh(["docker", "exec", host, "cat", "/etc/onprem-vllm/vllm.secrets/api-key"]).split()
    if not keys:
        sys.exit("no key in %s:/etc/onprem-vllm/vllm.secrets/api-key: deploy the lab first (make site)" % host)
    return keys[0]


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


def run_ours(host, env, args, levels, level, turn, client_cpus):
    """Our load generator at one level, run by the target machine's python3 (the lab host's, or this machine's in
    local mode)."""
    source = LOADGEN.read_text().replace("from __future__ import annotations", "")
    cfg = {"url": "%s/v1/chat/completions" % base_url(args), "model": args.served_model_name,
           "prompts": prompts(args, levels, turn), "output_lens": output_lens(args, levels), "concurrency": level,
           "requests": requests_at(args, level)}
    pin = ["taskset", "-c", client_cpus] if client_cpus else []
    python = [*pin, sys.executable if args.base_url else "python3", "-"]
    prefix = [] if args.base_url else ["docker", "exec", "-i", "-e", "OPENAI_API_KEY", host]
    # The settings travel in the program text (a JSON string is a Python string literal): a command-line argument
    # holding hundreds of long prompts would pass the kernel's limit on one argument.
    out = sh(prefix + python, env=env, stdin="%s\nCFG = %s\n%s" % (source, json.dumps(json.dumps(cfg)), OURS_DRIVER))
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def requests_at(args, level):
    """Requests at one concurrency level: --num-prompts, or --waves x level when that is more."""
    return max(args.num_prompts, args.waves * level)


def base_url(args):
    return args.base_url.rstrip("/") if args.base_url else "http://127.0.0.1:%d" % (
        FORWARD_PORT if args.tls_dir else args.port)


# Lab mode with --tls-dir: the loopback port of tls_forward.py on the lab host, which both clients use.
FORWARD_PORT = 18000


@contextmanager
def tls_forwarded(host, args):
    """A server that speaks only mutual TLS is reached by both clients through the same plain loopback door on its
    host (tls_forward.py, the host's local identity): `vllm bench serve` cannot present a client certificate."""
    if not args.tls_dir:
        yield
        return
    sh(["docker", "exec", "-i", host, "sh", "-c", "cat > /tmp/onprem-tls-forward.py"],
       stdin=(Path(__file__).parent / "tls_forward.py").read_text())
    sh(["docker", "exec", "-d", host, "python3", "/tmp/onprem-tls-forward.py", "--listen",
        "127.0.0.1:%d" % FORWARD_PORT, "--to", "127.0.0.1:%d" % args.port, "--tls-dir", args.tls_dir])
    # Until it listens (a client that came first would be refused).
    sh(["docker", "exec", host, "python3", "-c", "import socket, time\nfor _ in range(100):\n    try:\n"
        "        socket.create_connection(('127.0.0.1', %d), 1).close(); break\n    except OSError:\n"
        "        time.sleep(0.1)" % FORWARD_PORT])
    try:
        yield
    finally:
        sh(["docker", "exec", host, "pkill", "-f", "/tmp/onprem-tls-forward.py"])


def output_lens(args, levels):
    """Request i's output length, the same list for both clients, every level and every round: --output-len each,
    or with --output-len-range-ratio R drawn (seeded) from [L(1-R), L(1+R)], so that requests do not all finish in
    the same engine step and come back as one burst whose split across engine steps sets every TTFT."""
    count = max(requests_at(args, level) for level in levels)
    if not args.output_len_range_ratio:
        return [args.output_len] * count
    rng = random.Random(SEED)
    low = max(MIN_OUTPUT_LEN, round(args.output_len * (1 - args.output_len_range_ratio)))
    high = max(low, round(args.output_len * (1 + args.output_len_range_ratio)))
    return [rng.randint(low, high) for idx in range(count)]


def prompts(args, levels, turn):
    """Request i's prompt, the same list for both clients: --prompt each, or with --distinct-prompts led by the turn's
    tag (the run's and the turn's) and the request's number, so that no two requests share a prefix past the chat
    template (the server's prefix cache then skips none of their prefill, not even of a prompt another turn sent)."""
    count = max(requests_at(args, level) for level in levels)
    if not args.distinct_prompts:
        return [args.prompt] * count
    return ["%s.%d. %s" % (turn, idx, args.prompt) for idx in range(count)]


def sharegpt_rows(args, levels, turn):
    """The prompt as a ShareGPT-layout file (the lab image has no pandas, which vLLM's `custom` (JSONL) dataset needs),
    row i for request i (--disable-shuffle). With varied lengths row i's answer is output_lens[i] digits, which the
    Qwen3 tokenizers count as one token each; vLLM takes a request's output length from its row's answer, and
    check_output_tokens verifies that it did."""
    answers = ["7" * n if args.output_len_range_ratio else "ok" for n in output_lens(args, levels)]
    return json.dumps([{"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}
                       for prompt, answer in zip(prompts(args, levels, turn), answers)])


def check_output_tokens(args, levels, level, ours, theirs):
    """Both clients asked for output_lens[:n] (ignore_eos): their output token totals must be its sum."""
    want = sum(output_lens(args, levels)[:requests_at(args, level)])
    got = {"ours": ours.get("output_tokens"), "vllm bench serve": theirs.get("total_output_tokens")}
    wrong = {name: value for name, value in got.items() if value != want}
    if wrong:
        sys.exit("at concurrency %d the requests asked for %d output tokens in all, but %s: the two clients did not "
                 "send the same load (with --output-len-range-ratio: does this tokenizer count a digit as one "
                 "token?)" % (level, want, ", ".join("%s got %s" % kv for kv in wrong.items())))


def vllm_bench_args(args, level, dataset, result_dir):
    lengths = ["--sharegpt-output-len", str(args.output_len)] if not args.output_len_range_ratio else []
    return ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", base_url(args),
            "--model", args.model, "--served-model-name", args.served_model_name, "--dataset-name", "sharegpt",
            "--dataset-path", dataset, "--disable-shuffle", *lengths, "--ignore-eos",
            "--num-prompts", str(requests_at(args, level)), "--max-concurrency", str(level), "--request-rate", "inf",
            "--num-warmups", "1", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--save-result", "--result-dir", result_dir, "--result-filename", "c%d.json" % level]


class VllmBench:
    """vLLM's `vllm bench serve` code in one long-lived process (vllm_bench_levels.py), handed one level at a time so
    that the two clients take turns level by level; in lab mode it runs in the lab's serving image on the lab host."""

    def __init__(self, host, env, args, levels, client_cpus):
        self.host, self.args = host, args
        if args.base_url:
            self.tmp = tempfile.TemporaryDirectory(prefix="onprem-vllm-compare-")
            self.work = self.data = self.tmp.name
            pin = ["taskset", "-c", client_cpus] if client_cpus else []
            cmd = [*pin, args.vllm_python, str(LEVELS_SCRIPT)]
        else:
            self.tmp, self.work, self.data = None, "/tmp/onprem-vllm-compare", "/data"
            sh(["docker", "exec", "-i", host, "sh", "-c", "mkdir -p %s && rm -f %s/*.json && cat > %s/%s"
                % (self.work, self.work, self.work, LEVELS_SCRIPT.name)], stdin=LEVELS_SCRIPT.read_text())
            pin = ["--cpuset-cpus", client_cpus] if client_cpus else []
            cmd = ["docker", "exec", "-i", "-e", "OPENAI_API_KEY", host, "docker", "run", "-i", "--rm", "--network",
                   "host", *pin, "-e", "OPENAI_API_KEY", "-e", "HF_HUB_OFFLINE=1", "-v",
                   "/srv/hf-cache:/root/.cache/huggingface:ro", "-v", "%s:/data" % self.work, "--entrypoint",
                   "python3", args.image, "/data/" + LEVELS_SCRIPT.name]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        # vLLM's import is the heavy part: wait for it, so that it does not run beside our client's first turn.
        self.log = []
        self._read_until(READY)

    def _read_until(self, marker):
        for line in self.proc.stdout:
            if line.strip() == marker:
                return
            self.log = (self.log + [line])[-80:]
        sys.exit("vllm bench serve stopped (exit %s):\n%s" % (self.proc.wait(), "".join(self.log)))

    def run(self, levels, level, turn):
        rows = sharegpt_rows(self.args, levels, turn)
        if self.tmp:
            Path(self.work, "prompts.sharegpt").write_text(rows)
        else:
            sh(["docker", "exec", "-i", self.host, "sh", "-c", "cat > %s/prompts.sharegpt" % self.work], stdin=rows)
        self.proc.stdin.write(json.dumps(vllm_bench_args(self.args, level, self.data + "/prompts.sharegpt",
                                                         self.data)) + "\n")
        self.proc.stdin.flush()
        self._read_until(DONE)
        path = "%s/c%d.json" % (self.work, level)
        return json.loads(Path(path).read_text() if self.tmp else sh(["docker", "exec", self.host, "cat", path]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        if self.tmp:
            self.tmp.cleanup()


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
    parser.add_argument("--output-len-range-ratio", type=float, default=0.0,
                        help="vary output lengths uniformly within this ratio of --output-len (0: all the same)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--prompt-repeat", type=int, default=1,
                        help="the prompt is --prompt this many times over (a longer prefill per request)")
    parser.add_argument("--distinct-prompts", action="store_true",
                        help="number each request's prompt, so that the server's prefix cache cannot skip its prefill")
    parser.add_argument("--tolerance", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3, help="turns each client takes (ABBA order)")
    parser.add_argument("--container", default="vllm", help="the server's container on the lab host")
    parser.add_argument("--tls-dir", help="lab mode, a server over mutual TLS: the host's identities (e.g. "
                                          "/etc/onprem-vllm/tls); both clients go through tls_forward.py")
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
    if args.prompt_repeat < 1:
        sys.exit("--prompt-repeat needs at least 1 (got %d)" % args.prompt_repeat)
    args.prompt = " ".join([args.prompt] * args.prompt_repeat)
    if not levels or min(levels) < 1:
        sys.exit("--concurrency needs levels of at least 1 (got %r)" % args.concurrency)
    if not 0 <= args.output_len_range_ratio < 1 or args.output_len < MIN_OUTPUT_LEN:
        sys.exit("--output-len needs at least %d and --output-len-range-ratio 0 to below 1 (got %d, %s)"
                 % (MIN_OUTPUT_LEN, args.output_len, args.output_len_range_ratio))
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
    ours_runs, vllm_runs = {level: [] for level in levels}, {level: [] for level in levels}
    run_tag = secrets.token_hex(3)   # --distinct-prompts: nor does a prompt of an earlier run hit the prefix cache
    if args.tls_dir and args.base_url:
        sys.exit("--tls-dir is for lab mode (the lab host's identities), not with --base-url")
    with pinned, tls_forwarded(args.host, args), VllmBench(args.host, env, args, levels, client_cpus) as vllm_bench:
        # Level by level, the clients taking turns ABBA (ours, vLLM's, vLLM's, ours, ...): the two measurements of a
        # level lie a level's length apart, not a whole sweep's, so the server's drift over minutes (seen on the
        # lab and on the GPU host) weighs on both alike.
        for level in levels:
            for turn in range(2 * args.rounds):
                ours_turn = turn % 4 in (0, 3)
                if ours_turn:
                    figures = run_ours(args.host, env, args, levels, level, "%s-c%d-%d" % (run_tag, level, turn),
                                       client_cpus)
                    ours_runs[level].append(figures)
                else:
                    figures = vllm_bench.run(levels, level, "%s-c%d-%d" % (run_tag, level, turn))
                    vllm_runs[level].append(figures)
                if ours_runs[level] and vllm_runs[level]:
                    check_output_tokens(args, levels, level, ours_runs[level][-1], vllm_runs[level][-1])
                keys = METRICS[0][0 if ours_turn else 1], METRICS[2][0 if ours_turn else 1]
                # Each turn's figures as they come, so that a run cut short still leaves them in its log.
                print("c%d round %d/%d %-16s %8.1f tok/s, TTFT p50 %.2f ms" % (
                    level, turn // 2 + 1, args.rounds, "ours" if ours_turn else "vllm bench serve",
                    figures.get(keys[0]) or 0, figures.get(keys[1]) or 0), flush=True)
    rows, worst = [], 0.0
    columns = ("concurrency", "metric", "ours", "vllm bench", "diff %", "ours runs", "vllm runs")
    header = "%-11s | %-13s | %10s %10s %8s | %-20s | %-20s" % columns
    print("\n" + header + "\n" + "-" * len(header))
    for level in levels:
        for ours_key, vllm_key, label in METRICS:
            ours_values = [run.get(ours_key) for run in ours_runs[level]]
            vllm_values = [run.get(vllm_key) for run in vllm_runs[level]]
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
            "", ours_runs[level][0].get("prompt_tokens_mean"),
            round(vllm_runs[level][0]["total_input_tokens"] / max(1, vllm_runs[level][0]["completed"]), 1),
            ours_runs[level][0].get("successful"), vllm_runs[level][0].get("completed")))
    print("\nlargest |difference| on output tok/s and TTFT p50 (medians of %d rounds): %.1f%% "
          "(tolerance %.0f%%)" % (args.rounds, worst, args.tolerance))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ours": ours_runs, "vllm_bench": vllm_runs,
                                               "settings": vars(args), "cpus": split}, indent=2, default=str))
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
