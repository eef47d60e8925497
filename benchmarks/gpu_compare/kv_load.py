# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load a vLLM server with N requests at once, each a prompt of PROMPT_TOKENS token ids (the longest max_model_len
allows) and a few output tokens, through /v1/completions; print how each ended. Standard library only.

    python3 benchmarks/gpu_compare/kv_load.py URL MODEL N PROMPT_TOKENS VOCAB [MAX_TOKENS]

The prompts are token ids (not text), drawn from 1000..VOCAB-1 with a fixed seed, so any model's vocabulary holds
them and no two prompts share a prefix (no prefix-cache hit). Exit status 0 when every request got its tokens.
"""
import json
import random
import sys
import threading
import time
import urllib.request


def one(url, model, ids, max_tokens, results, index):
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.time()
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            answer = json.loads(response.read())
        results[index] = ("ok", answer["usage"]["completion_tokens"], round(time.time() - start, 1))
    except Exception as exc:  # report every failure, never hide one
        results[index] = ("error", str(exc)[:200], round(time.time() - start, 1))


def main(url, model, count, prompt_tokens, vocab, max_tokens=16):
    count, prompt_tokens, vocab, max_tokens = int(count), int(prompt_tokens), int(vocab), int(max_tokens)
    rng = random.Random(0)
    results = [None] * count
    threads = []
    start = time.time()
    for index in range(count):
        ids = [rng.randrange(1000, vocab) for _position in range(prompt_tokens)]
        thread = threading.Thread(target=one, args=(url, model, ids, max_tokens, results, index))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    ok = sum(1 for r in results if r and r[0] == "ok" and r[1] == max_tokens)
    print("load: %d requests of %d prompt tokens + %d output tokens at once: %d ok in %.1f s"
          % (count, prompt_tokens, max_tokens, ok, time.time() - start))
    for index, result in enumerate(results):
        if not result or result[0] != "ok":
            print("request %d: %s" % (index, result))
    return 0 if ok == count else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
