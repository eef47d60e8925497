# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How far a vLLM server's own answers move between runs: the known-answer gate's tolerance, measured.

Asks the gate's prompt set (plugins/module_utils/known_answers.py) alone, then ROUNDS times while CLIENTS other clients
keep the server busy with random prompts of random lengths (other batch shapes, chunked prefill, other kernels), and
compares each round with the lone answers by the gate's own rule. Prints the largest logprob difference on the
common prefix, the flipped positions and whether the gate's tolerance accepts them, and the gate's verdict.

  python3 benchmarks/known_answers_variance.py --url http://127.0.0.1:8000 --model q [--key-file F] [--clients 8]
      [--rounds 3] [--positions 16] [--out result.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".collections"))
from ansible_collections.onprem.vllm.plugins.module_utils import known_answers as ka  # noqa: E402
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import Response  # noqa: E402

WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "north", "paper")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--key-file", help="file holding the API key (else $OPENAI_API_KEY or none)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--positions", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args()
    key = open(args.key_file).read().strip() if args.key_file else os.environ.get("OPENAI_API_KEY", "")
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key

    def http(method, path, body):
        request = urllib.request.Request(args.url.rstrip("/") + path, json.dumps(body).encode(), headers,
                                         method=method)
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:
                return Response(resp.getcode(), resp.read().decode())
        except urllib.error.HTTPError as exc:
            return Response(exc.code, exc.read().decode())

    prompts = ka.DEFAULT_PROMPTS
    tolerance = {"positions": args.positions, "max_logprob_delta": 0.5, "tie_margin": 0.5, "min_cosine": 0.995}
    lone = ka.ask_all(http, "generate", args.model, prompts, args.positions, 5)
    stop = threading.Event()

    def noise(seed: int) -> None:
        rnd = random.Random(seed)
        while not stop.is_set():
            text = " ".join(rnd.choices(WORDS, k=rnd.randint(5, 1500)))
            http("POST", "/v1/chat/completions", {"model": args.model, "messages": [{"role": "user", "content": text}],
                                                  "max_tokens": rnd.randint(4, 128), "temperature": 0.8})

    threads = [threading.Thread(target=noise, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    worst, flips, failures = 0.0, [], []
    for _round in range(args.rounds):
        busy = ka.ask_all(http, "generate", args.model, prompts, args.positions, 5)
        failures += ka.compare(lone, busy, prompts, **tolerance)
        for prompt, a, b in zip(prompts, lone, busy):
            for k, (x, y) in enumerate(zip(a["logprobs"], b["logprobs"])):
                if a["tokens"][k] != b["tokens"][k]:
                    flips.append({"prompt": prompt, "position": k, "recorded": a["tokens"][k], "busy": b["tokens"][k],
                                  "recorded_margin": ka.margin(a["top"][k])})
                    break
                worst = max(worst, abs(x - y))
    stop.set()
    result = {"clients": args.clients, "rounds": args.rounds, "positions": args.positions,
              "max_logprob_delta_on_common_prefix": round(worst, 6), "flips": flips, "gate_failures": failures,
              "lone_margins_min": round(min(m for a in lone for m in map(ka.margin, a["top"]) if m is not None), 6)}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"lone": lone, **result}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
