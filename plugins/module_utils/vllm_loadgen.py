# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A streaming load generator for vLLM's OpenAI-compatible server. Standard library only (asyncio + raw HTTP/1.1).

One request = POST /v1/chat/completions with ``stream: true`` and ``stream_options: {include_usage: true}``; the
Server-Sent Events stream is parsed as it arrives. Per request: time to first token (TTFT: from just before the
connection is opened to the first chunk with choices, as ``vllm bench serve`` counts it), output tokens (from the
final usage chunk, else the number of content chunks), decode tok/s ((output tokens - 1) / time from the first to the
last token chunk), end-to-end latency. Per concurrency level: ``num_requests`` requests with at most ``concurrency`` in flight (vLLM's
``vllm bench serve --max-concurrency C --request-rate inf`` model), TTFT mean/p50/p99, decode tok/s, aggregate output
tok/s (all output tokens / the level's wall time), errors by cause.

Percentiles interpolate linearly between order statistics, as numpy.percentile (what ``vllm bench serve`` uses).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from urllib.parse import urlsplit

MAX_CONCURRENCY = 1024


class LoadgenError(Exception):
    """Bad input the operator can fix; the message says what to change."""


# ------------------------------------------------------------------------------------------------------------------
# Input checks


def check_concurrency(levels):
    """A list of positive ints, in the order given. Raises LoadgenError with a clear message."""
    if isinstance(levels, (str, bytes)):
        levels = [part for part in str(levels).replace(" ", "").split(",") if part != ""]
    if not levels:
        raise LoadgenError("concurrency is empty: give one or more levels, e.g. [1, 4, 8, 16, 32]")
    out = []
    for level in levels:
        try:
            value = int(level)
        except (TypeError, ValueError):
            raise LoadgenError("concurrency level %r is not a whole number" % (level,))
        if value < 1:
            raise LoadgenError("concurrency level %d is not allowed: every level must be at least 1 (got %s)"
                               % (value, list(levels)))
        if value > MAX_CONCURRENCY:
            raise LoadgenError("concurrency level %d is above the limit of %d" % (value, MAX_CONCURRENCY))
        out.append(value)
    return out


def check_positive(name, value, maximum=None):
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise LoadgenError("%s must be a whole number (got %r)" % (name, value))
    if number < 1:
        raise LoadgenError("%s must be at least 1 (got %d)" % (name, number))
    if maximum is not None and number > maximum:
        raise LoadgenError("%s must be at most %d (got %d)" % (name, maximum, number))
    return number


def chat_url(base_url):
    """http://host:8000, http://host:8000/v1 or the full URL → the chat completions URL."""
    url = (base_url or "").strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LoadgenError("endpoint %r is not an http(s) URL such as http://172.30.99.11:8000/v1" % (base_url,))
    if url.endswith("/chat/completions"):
        return url
    if not url.endswith("/v1"):
        url += "/v1"
    return url + "/chat/completions"


# ------------------------------------------------------------------------------------------------------------------
# Wire formats


class ChunkedDecoder:
    """Incremental decoder for HTTP/1.1 ``Transfer-Encoding: chunked``."""

    def __init__(self):
        self._buf = b""
        self._state = "size"  # size → data → crlf → size … → trailer → done
        self._remaining = 0
        self.done = False

    def feed(self, data):
        self._buf += data
        out = []
        while not self.done:
            if self._state == "size":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    break
                size_text = self._buf[:end].split(b";", 1)[0].strip()
                self._buf = self._buf[end + 2:]
                try:
                    self._remaining = int(size_text, 16)
                except ValueError:
                    raise ValueError("bad chunk size line %r" % size_text[:40])
                self._state = "trailer" if self._remaining == 0 else "data"
            elif self._state == "data":
                if not self._buf:
                    break
                take = self._buf[:self._remaining]
                out.append(take)
                self._buf = self._buf[len(take):]
                self._remaining -= len(take)
                if self._remaining == 0:
                    self._state = "crlf"
            elif self._state == "trailer":
                # Trailer fields up to the empty line: read to the end, so that a kept-alive connection's next answer
                # starts at its status line.
                end = self._buf.find(b"\r\n")
                if end < 0:
                    break
                self._buf = self._buf[end + 2:]
                self.done = end == 0
            else:
                if len(self._buf) < 2:
                    break
                self._buf = self._buf[2:]
                self._state = "size"
        return b"".join(out)


class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get the ``data`` payloads of complete events."""

    def __init__(self):
        self._buf = b""
        self._data = []

    def feed(self, data):
        self._buf += data
        events = []
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                break
            line = self._buf[:cut].rstrip(b"\r").decode("utf-8", "replace")
            self._buf = self._buf[cut + 1:]
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith(":"):
                continue  # comment / keep-alive
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events

    def flush(self):
        """The last event when the stream ended without its blank line."""
        tail = self._buf.decode("utf-8", "replace").strip()
        if tail.startswith("data:"):
            value = tail[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        self._buf = b""
        events, self._data = (["\n".join(self._data)] if self._data else []), []
        return events


def chunk_text(chunk):
    """Generated text carried by one chat.completion.chunk (content or reasoning content), or None."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    for key in ("content", "reasoning_content", "reasoning"):
        if delta.get(key):
            return delta[key]
    return None


def build_body(model, prompt, system_prompt=None, max_tokens=128, ignore_eos=False, temperature=None, extra=None):
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": prompt})
    body = {"model": model, "messages": messages, "max_tokens": int(max_tokens), "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        # vLLM's extension: generate exactly max_tokens. The same field, and only it, as `vllm bench serve
        # --ignore-eos` sends: min_tokens as well would ask vLLM's sampler for work the reference's load does not.
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = float(temperature)
    body.update(extra or {})
    return body


def http_error_message(status, reason, body_text, url):
    text = (body_text or "").strip().replace("\n", " ")[:200]
    hint = ""
    if status == 401:
        hint = " (the API key was refused: check the key given to the benchmark, e.g. the Vault-held onprem_vllm_api_key)"
    elif status == 404:
        hint = " (wrong path or model name: check the served model name)"
    return "HTTP %d %s from %s%s%s" % (status, reason, url, hint, (": " + text) if text else "")


# ------------------------------------------------------------------------------------------------------------------
# One request


async def _read_headers(reader):
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection without an answer")
    parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ConnectionError("not an HTTP answer: %r" % status_line[:60])
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, reason, headers


async def _body_chunks(reader, headers, progress):
    """Yield the decoded body bytes as they arrive; progress["complete"] turns true once the whole body was read."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        decoder = ChunkedDecoder()
        while not decoder.done:
            data = await reader.read(65536)
            if not data:
                return
            out = decoder.feed(data)
            if out:
                yield out
        progress["complete"] = True
        return
    length = headers.get("content-length")
    remaining = int(length) if length is not None else None
    while remaining is None or remaining > 0:
        data = await reader.read(65536 if remaining is None else min(65536, remaining))
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        yield data
    progress["complete"] = remaining == 0


class ConnectionPool:
    """Idle HTTP/1.1 keep-alive connections, reused by the next request as client libraries do (`vllm bench serve`'s
    aiohttp session among them), so the server does the connection work a real client causes. One pool per event
    loop."""

    def __init__(self, ssl_verify=True):
        # True, False (no certificate check) or the ssl.SSLContext to use as it is.
        self.ssl_verify = ssl_verify
        self._idle = {}

    async def acquire(self, scheme, host, port):
        """(reader, writer, reused) for the endpoint: an idle connection when one is left, else a new one."""
        idle = self._idle.get((scheme, host, port), [])
        while idle:
            reader, writer = idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        context = None
        if isinstance(self.ssl_verify, ssl.SSLContext):  # e.g. a pinned certificate and a client identity
            context = self.ssl_verify if scheme == "https" else None
        elif scheme == "https":
            context = ssl.create_default_context()
            if not self.ssl_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        reader, writer = await asyncio.open_connection(host, port, ssl=context)
        return reader, writer, False

    def release(self, scheme, host, port, reader, writer):
        self._idle.setdefault((scheme, host, port), []).append((reader, writer))

    async def close(self):
        writers = [writer for conns in self._idle.values() for _reader, writer in conns]
        self._idle = {}
        for writer in writers:
            writer.close()
        for writer in writers:
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass


async def stream_chat(url, api_key, body, timeout=120.0, ssl_verify=True, pool=None, headers=None):
    """One streaming chat completion. Returns a result dict; never raises for network or HTTP failures.

    pool: a ConnectionPool to take the connection from and give it back to (else one connection, closed after).
    headers: more request headers {name: value} (e.g. the gateway's X-Onprem-Canary, which pins a server)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    endpoint = (parts.scheme, parts.hostname, port)
    own_pool = pool is None
    if own_pool:
        pool = ConnectionPool(ssl_verify)
    path = parts.path + (("?" + parts.query) if parts.query else "")
    payload = json.dumps(body).encode("utf-8")
    extra_headers = headers or {}
    headers = [
        "POST %s HTTP/1.1" % path,
        "Host: %s" % parts.netloc,
        "Content-Type: application/json",
        "Accept: text/event-stream",
        "Content-Length: %d" % len(payload),
        "User-Agent: onprem.vllm-benchmark",
    ]
    if api_key:
        headers.append("Authorization: Bearer %s" % api_key)
    headers += ["%s: %s" % item for item in sorted(extra_headers.items())]
    request = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + payload
    result = {"ok": False, "ttft": None, "latency": None, "output_tokens": 0, "prompt_tokens": None,
              "decode_tps": None, "tpot": None, "itl": [], "error": None}
    start = time.perf_counter()
    writer = None
    stage = ["connecting to"]

    async def run():
        nonlocal writer
        while True:
            stage[0] = "connecting to"
            reader, writer, reused = await pool.acquire(*endpoint)
            stage[0] = "waiting for an answer from"
            try:
                writer.write(request)
                await writer.drain()
                status, reason, resp_headers = await _read_headers(reader)
                break
            except (OSError, ConnectionError):
                writer.close()
                writer = None
                if not reused:
                    raise
                # The server had closed the idle connection (its keep-alive timeout): a new one, as HTTP clients do.
        progress = {"complete": False}
        if status != 200:
            text = b""
            async for data in _body_chunks(reader, resp_headers, progress):
                text += data
                if len(text) > 4096:
                    break
            result["error"] = http_error_message(status, reason, text.decode("utf-8", "replace"), url)
            result["status"] = status
            return
        parser = SSEParser()
        first = last = None
        content_chunks = 0
        usage = None
        done = False
        async for data in _body_chunks(reader, resp_headers, progress):
            now = time.perf_counter()
            for event in parser.feed(data):
                if event.strip() == "[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(event)
                except ValueError:
                    result["error"] = "not JSON in the event stream: %r" % event[:80]
                    return
                if chunk.get("error"):
                    result["error"] = "server error in the stream: %s" % str(chunk["error"])[:200]
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices"):
                    # As `vllm bench serve`: the first chunk with choices is the first token; every such chunk is a
                    # token step (the trailing usage chunk has no choices).
                    if first is None:
                        first = now
                    else:
                        result["itl"].append(now - last)
                    last = now
                    if chunk_text(chunk) is not None:
                        content_chunks += 1
        end = time.perf_counter()
        if not done and usage is None:
            result["error"] = "the stream ended early (no [DONE] and no usage)"
            return
        tokens = int(usage.get("completion_tokens", content_chunks)) if usage else content_chunks
        result["output_tokens"] = tokens
        result["prompt_tokens"] = usage.get("prompt_tokens") if usage else None
        result["latency"] = end - start
        if first is None:
            result["error"] = "no token in the stream (no chunk with choices)"
            return
        result["ttft"] = first - start
        if tokens > 1 and last > first:
            result["tpot"] = (last - first) / (tokens - 1)
            result["decode_tps"] = (tokens - 1) / (last - first)
        result["ok"] = True
        if progress["complete"] and resp_headers.get("connection", "").lower() != "close":
            pool.release(*endpoint, reader, writer)
            writer = None

    try:
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        result["error"] = "timed out after %ss %s %s%s" % (
            timeout, stage[0], url, " (host unreachable or port filtered?)" if stage[0] == "connecting to" else "")
    except (ConnectionRefusedError, socket.gaierror, OSError, ConnectionError) as exc:
        text = str(exc) or exc.__class__.__name__
        result["error"] = "cannot reach %s: %s" % (url, text)
    except ValueError as exc:
        result["error"] = "bad answer from %s: %s" % (url, exc)
    finally:
        if writer is not None:
            writer.close()
        if own_pool:
            await pool.close()
    if result["latency"] is None:
        result["latency"] = time.perf_counter() - start
    return result


# ------------------------------------------------------------------------------------------------------------------
# Statistics


def percentile(values, pct):
    """numpy.percentile's default (linear) on a plain list; None for an empty list."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    rank = (len(data) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def mean(values):
    data = [v for v in values if v is not None]
    return sum(data) / len(data) if data else None


def _ms(value):
    return None if value is None else round(value * 1000.0, 3)


def _r(value, digits=3):
    return None if value is None else round(value, digits)


def summarize_level(concurrency, results, duration):
    """Aggregate one concurrency level. duration: wall seconds from the first send to the last answer."""
    ok = [r for r in results if r.get("ok")]
    errors = {}
    for item in results:
        if not item.get("ok"):
            key = item.get("error") or "unknown error"
            errors[key] = errors.get(key, 0) + 1
    ttfts = [r["ttft"] for r in ok]
    output_tokens = sum(r["output_tokens"] for r in ok)
    prompt_tokens = [r["prompt_tokens"] for r in ok if r.get("prompt_tokens") is not None]
    itls = [value for r in ok for value in r.get("itl", [])]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "successful": len(ok),
        "failed": len(results) - len(ok),
        "errors": [{"error": key, "count": count} for key, count in sorted(errors.items(), key=lambda kv: -kv[1])],
        "duration_s": _r(duration),
        "output_tokens": output_tokens,
        "prompt_tokens_mean": _r(mean(prompt_tokens), 1),
        "request_throughput": _r(len(ok) / duration if duration > 0 else None),
        "output_throughput": _r(output_tokens / duration if duration > 0 and ok else None, 2),
        "ttft_mean_ms": _ms(mean(ttfts)),
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p99_ms": _ms(percentile(ttfts, 99)),
        "tpot_mean_ms": _ms(mean(r.get("tpot") for r in ok)),
        "itl_mean_ms": _ms(mean(itls)),
        "decode_tps_mean": _r(mean(r.get("decode_tps") for r in ok), 2),
        "decode_tps_p50": _r(percentile([r.get("decode_tps") for r in ok], 50), 2),
        "latency_mean_ms": _ms(mean(r["latency"] for r in ok)),
        "latency_p99_ms": _ms(percentile([r["latency"] for r in ok], 99)),
    }


# ------------------------------------------------------------------------------------------------------------------
# Driving the load


async def run_level(url, api_key, body, concurrency, num_requests, timeout=120.0, ssl_verify=True, on_done=None,
                    pool=None, headers=None):
    """num_requests requests, at most `concurrency` in flight. Returns (results, wall seconds).

    body: one request body for every request, or a list of them: request i sends body[i % len(body)] (requests start
    in index order), e.g. to give requests different output lengths so that they do not finish in lockstep.
    """
    bodies = body if isinstance(body, list) else [body]
    sem = asyncio.Semaphore(concurrency)
    results = []

    async def one(idx):
        async with sem:
            res = await stream_chat(url, api_key, bodies[idx % len(bodies)], timeout=timeout, ssl_verify=ssl_verify,
                                    pool=pool, headers=headers)
            results.append(res)
            if on_done is not None:
                on_done(res, len(results), num_requests)
            return res

    start = time.perf_counter()
    await asyncio.gather(*(one(idx) for idx in range(num_requests)))
    return results, time.perf_counter() - start


def run_sweep(url, api_key, body, concurrency, num_requests, warmup=1, timeout=120.0, ssl_verify=True,
              progress=None, stop_when_all_fail=True, deadline=None, headers=None):
    """The whole sweep for one endpoint (blocking). Returns a dict with levels, partial flag and notes.

    num_requests: an int (the same at every level) or a dict {concurrency: n}. progress(event: dict) is called
    after every request and level. deadline: time.monotonic() value after which no new level starts.
    """
    levels = check_concurrency(concurrency)
    out = {"url": url, "levels": [], "partial": False, "notes": [], "warmup": {"requests": 0, "failed": 0}}

    def report(event):
        if progress is not None:
            progress(event)

    loop = asyncio.new_event_loop()
    pool = ConnectionPool(ssl_verify)
    try:
        if warmup:
            results, elapsed = loop.run_until_complete(
                run_level(url, api_key, body, 1, int(warmup), timeout=timeout, ssl_verify=ssl_verify, pool=pool,
                          headers=headers))
            failed = [r for r in results if not r["ok"]]
            out["warmup"] = {"requests": len(results), "failed": len(failed), "duration_s": _r(elapsed)}
            report({"phase": "warmup", "done": len(results), "failed": len(failed)})
            if failed and len(failed) == len(results) and stop_when_all_fail:
                level = summarize_level(0, results, elapsed)
                out["partial"] = True
                out["notes"].append("every warm-up request failed (%s); no level was measured"
                                    % failed[0]["error"])
                out["warmup"]["errors"] = level["errors"]
                return out
        for idx, level in enumerate(levels):
            if deadline is not None and time.monotonic() > deadline:
                out["partial"] = True
                out["notes"].append("time budget spent: levels %s were not run" % levels[idx:])
                break
            count = num_requests.get(level, num_requests.get(str(level))) if isinstance(num_requests, dict) \
                else num_requests
            count = int(count)

            def on_done(res, done, total, level=level):
                report({"phase": "level", "concurrency": level, "done": done, "total": total, "ok": res["ok"]})

            results, elapsed = loop.run_until_complete(
                run_level(url, api_key, body, level, count, timeout=timeout, ssl_verify=ssl_verify, on_done=on_done,
                          pool=pool, headers=headers))
            summary = summarize_level(level, results, elapsed)
            out["levels"].append(summary)
            report({"phase": "level_done", "concurrency": level, "summary": summary})
            if summary["failed"]:
                out["partial"] = True
            if summary["successful"] == 0 and stop_when_all_fail:
                rest = levels[idx + 1:]
                out["notes"].append("0 of %d requests succeeded at concurrency %d (%s)%s"
                                    % (count, level, summary["errors"][0]["error"],
                                       "; levels %s were not run" % rest if rest else ""))
                break
    finally:
        loop.run_until_complete(pool.close())
        loop.close()
    return out


def sweep_failures(host, sweep):
    """Human-readable problems of one host's sweep (empty when every request succeeded)."""
    problems = list(sweep.get("notes") or [])
    for level in sweep.get("levels", []):
        if level["failed"] and level["successful"]:
            problems.append("%d of %d requests failed at concurrency %d (%s)"
                            % (level["failed"], level["requests"], level["concurrency"], level["errors"][0]["error"]))
    return ["%s: %s" % (host, text) for text in problems]


# ------------------------------------------------------------------------------------------------------------------
# Regression gate


def compare_to_baseline(current_levels, baseline_levels, max_throughput_drop_pct, max_ttft_p99_rise_pct):
    """Regressions of the current run against a saved baseline, level by level (common concurrency levels only).

    Returns (regressions: list of str, comparisons: list of dict).
    """
    base = {int(level["concurrency"]): level for level in baseline_levels or []}
    regressions, comparisons = [], []
    for level in current_levels or []:
        conc = int(level["concurrency"])
        old = base.get(conc)
        if old is None:
            continue
        row = {"concurrency": conc}
        for key, limit, worse in (("output_throughput", max_throughput_drop_pct, -1),
                                  ("ttft_p99_ms", max_ttft_p99_rise_pct, 1)):
            now_v, old_v = level.get(key), old.get(key)
            row[key] = {"baseline": old_v, "current": now_v, "change_pct": None}
            if old_v in (None, 0):
                continue
            if now_v is None:
                regressions.append("concurrency %d: %s has no value now (baseline %s)" % (conc, key, old_v))
                continue
            change = (now_v - old_v) / old_v * 100.0
            row[key]["change_pct"] = round(change, 2)
            if limit is not None and change * worse > float(limit):
                what = "output throughput dropped" if worse < 0 else "p99 TTFT rose"
                regressions.append("concurrency %d: %s %.1f%% (%s → %s; allowed %s%%)"
                                   % (conc, what, abs(change), old_v, now_v, limit))
        comparisons.append(row)
    return regressions, comparisons
