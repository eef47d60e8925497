# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stand-in for vLLM's streaming chat endpoint whose timing is known by construction, to calibrate load clients.

  python3 benchmarks/stepped_server.py [--port 8111] [--step-ms 3]

An engine "step" runs every --step-ms: each stream in flight gets one token, and requests that arrived since the last
step join it and get their first token there. So the time from a request's arrival to its first token is at most one
step, whatever the concurrency, and every token after it one step. A client that reports a longer time to first token
adds the rest itself (its own event loop falling behind). Answers POST /v1/chat/completions (streaming, HTTP/1.1
keep-alive, chunked, a usage chunk and [DONE] as vLLM sends them) and 404 to anything else; needs only the standard
library, so it runs with any python3 (the lab hosts' too).
"""
from __future__ import annotations

import argparse
import asyncio
import json

CHUNK = {"id": "chatcmpl-stepped", "object": "chat.completion.chunk", "created": 0, "model": "stepped",
         "choices": [{"index": 0, "delta": {"content": "tok "}, "logprobs": None, "finish_reason": None}]}


def http_chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj):
    return http_chunk(("data: " + json.dumps(obj) + "\n\n").encode())


class SteppedEngine:
    def __init__(self, step_s):
        self.step_s = step_s
        self.arrived = []   # queues of requests that join at the next step
        self.running = []

    async def run(self):
        loop = asyncio.get_running_loop()
        next_step = loop.time()
        while True:
            next_step += self.step_s
            await asyncio.sleep(max(0.0, next_step - loop.time()))
            self.running.extend(self.arrived)
            self.arrived = []
            for queue in self.running:
                queue.put_nowait(None)

    async def handle(self, reader, writer):
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    break
                length = 0
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _sep, value = header.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if not request_line.startswith(b"POST /v1/chat/completions"):
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                request = json.loads(body)
                tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or 16)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                queue = asyncio.Queue()
                self.arrived.append(queue)
                for _token in range(tokens):
                    await queue.get()
                    writer.write(sse(CHUNK))
                self.running.remove(queue)
                writer.write(sse(dict(CHUNK, choices=[], usage={"prompt_tokens": 46, "completion_tokens": tokens,
                                                                "total_tokens": 46 + tokens})))
                writer.write(http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        writer.close()


async def serve(host, port, step_s):
    engine = SteppedEngine(step_s)
    asyncio.ensure_future(engine.run())
    server = await asyncio.start_server(engine.handle, host, port, backlog=512)
    print("stepped server on %s:%d, one step every %.1f ms" % (host, port, step_s * 1000), flush=True)
    await server.serve_forever()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8111)
    parser.add_argument("--step-ms", type=float, default=3.0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.step_ms / 1000.0))


if __name__ == "__main__":
    main()
