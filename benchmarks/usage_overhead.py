# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What token accounting costs a vLLM server: the usage middleware (roles/vllm_server/files/onprem_vllm_usage.py)
around an ASGI app that answers as vLLM does, against the same app without it, in one process on this machine.

Three answers: a chat completion (one JSON body), a streamed chat completion (128 Server-Sent Events chunks, each with
the usage so far, as --enable-force-include-usage makes them) and an embedding batch (64 x 1024 floats, one 1.3 MB
JSON body). Per answer kind, REQUESTS requests each way, interleaved: the time from the call to the last byte sent,
p50 and p99, and the difference; the memory the middleware holds per request (tracemalloc's peak over one request,
with and without); the ledger's bytes per request before and after folding. The ledger is a real folder (fsync within a
second, as on a server).

  python3 benchmarks/usage_overhead.py [--requests 2000] [--json FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
SPEC = importlib.util.spec_from_file_location(
    "onprem_vllm_usage", os.path.join(ROOT, "roles", "vllm_server", "files", "onprem_vllm_usage.py"))
usage = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(usage)


def _bodies():
    chat = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "qwen3",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 150},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 812, "total_tokens": 962, "completion_tokens": 150,
                                 "prompt_tokens_details": None}}).encode()
    stream = [b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                                      "model": "qwen3", "choices": [{"index": 0, "delta": {"content": "word "}}],
                                      "usage": {"prompt_tokens": 812, "completion_tokens": n,
                                                "total_tokens": 812 + n}}).encode() + b"\n\n"
              for n in range(1, 129)] + [b"data: [DONE]\n\n"]
    embeddings = json.dumps({"object": "list", "model": "embed",
                             "data": [{"index": i, "object": "embedding", "embedding": [0.0123456789] * 1024}
                                      for i in range(64)],
                             "usage": {"prompt_tokens": 4096, "total_tokens": 4096}}).encode()
    return {"chat": [chat], "chat stream (128 chunks)": stream, "embeddings (64 x 1024)": [embeddings]}


def _app(pieces):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return app


SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
         "headers": [(b"x-onprem-client", b"ide-assistants"), (b"content-type", b"application/json")]}


async def _receive():
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(_message):
    return None


async def _timed(app, count):
    times = []
    for _request in range(count):
        started = time.perf_counter()
        await app(SCOPE, _receive, _send)
        times.append(time.perf_counter() - started)
    return times


def _pct(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _peak(app):
    tracemalloc.start()
    asyncio.run(app(SCOPE, _receive, _send))
    _size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind, pieces in _bodies().items():
            bare = _app(pieces)
            counted = usage.UsageMiddleware(bare, directory=folder, model="qwen3")
            without, with_ = [], []
            for _round in range(10):  # interleaved rounds: the machine's drift falls on both alike
                without += asyncio.run(_timed(bare, args.requests // 10))
                with_ += asyncio.run(_timed(counted, args.requests // 10))
            results[kind] = {
                "requests_each_way": len(with_), "body_bytes": sum(len(p) for p in pieces),
                "without_p50_us": round(statistics.median(without) * 1e6, 1),
                "with_p50_us": round(statistics.median(with_) * 1e6, 1),
                "without_p99_us": round(_pct(without, 0.99) * 1e6, 1),
                "with_p99_us": round(_pct(with_, 0.99) * 1e6, 1),
                "memory_peak_without_bytes": _peak(bare), "memory_peak_with_bytes": _peak(counted)}
            results[kind]["added_p50_us"] = round(results[kind]["with_p50_us"] - results[kind]["without_p50_us"], 1)
            results[kind]["added_p99_us"] = round(results[kind]["with_p99_us"] - results[kind]["without_p99_us"], 1)
        ledger = os.path.join(folder, usage.LEDGER)
        with open(ledger, "rb") as handle:
            lines_before = len(handle.read().splitlines())
        bytes_before = os.path.getsize(ledger)
        usage.Ledger(folder)  # a server's start folds the ledger
        results["ledger"] = {"requests": lines_before, "bytes_per_request": round(bytes_before / lines_before, 1),
                             "bytes_after_folding": os.path.getsize(ledger)}
    head = ("answer", "p50 us", "+usage", "added", "p99 us", "+usage", "added", "peak +bytes")
    print("%-26s %10s %10s %10s %10s %10s %10s %12s" % head)
    for kind, row in results.items():
        if kind == "ledger":
            continue
        print("%-26s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %12d" % (
            kind, row["without_p50_us"], row["with_p50_us"], row["added_p50_us"], row["without_p99_us"],
            row["with_p99_us"], row["added_p99_us"], row["memory_peak_with_bytes"] - row["memory_peak_without_bytes"]))
    print("ledger: %(requests)d requests, %(bytes_per_request).1f bytes each; %(bytes_after_folding)d bytes folded"
          % results["ledger"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
