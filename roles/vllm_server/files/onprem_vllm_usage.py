# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tokens per client and model (`vllm serve --middleware onprem_vllm_usage.UsageMiddleware`).

vLLM counts tokens per model only. This pure-ASGI middleware (standard library only, so it loads in any vLLM image)
counts, for every POST the server answers, one request and the prompt and completion tokens of the answer's `usage`,
under the client the gateway names in `X-Onprem-Client` (the gateway sets it from the client's key and drops one a
client sent; a request without it, a gate or benchmark on the host, counts as `direct`) and the deployment's served
model (ONPREM_VLLM_USAGE_MODEL). It runs inside the bearer-key guard (files/onprem_vllm_auth.py): only holders of the
server key reach it, so nobody else can name a client.

Where the tokens are known: the answer's last `usage` object, read from the body as it is sent (JSON or a Server-Sent
Events stream) without holding the body. vLLM gives one in every answer it completes; with
`--enable-force-include-usage` (the role passes it) every streamed chunk carries the usage so far, so a stream the
client cancels, or one that fails midway, counts what was generated until then. An answer without one (an error)
counts the request and no tokens.

The counts live on the host (ONPREM_VLLM_USAGE_DIR, mounted read-write), one folder per deployment, and survive
restarts and replacements of the server: usage.jsonl, one line per answered request
({"day", "client", "model", "requests", "prompt", "completion"}, UTC days), appended under an exclusive lock
(usage.lock, so the server a rollout replaces and its successor never interleave), made durable within a second, and
folded into one line per day, client and model at start-up and every COMPACT_EVERY lines (written aside, then renamed
over the ledger). A torn last line (a power cut) is skipped. GET /onprem/usage (keyed, like every route but the
probes) answers the folded counts: the gateway's usage service (roles/gateway, files/onprem_gateway_usage.py) polls
it on every server, sums them, exports them to Prometheus and enforces the clients' budgets.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
import uuid

USAGE_DIR_ENV = "ONPREM_VLLM_USAGE_DIR"
MODEL_ENV = "ONPREM_VLLM_USAGE_MODEL"
USAGE_PATH = "/onprem/usage"
CLIENT_HEADER = b"x-onprem-client"
CLIENT_NAME = re.compile(rb"^[A-Za-z0-9_.-]{1,64}$")
DIRECT = "direct"
LEDGER = "usage.jsonl"
LOCK = "usage.lock"
LEDGER_ID = "ledger-id"
COMPACT_EVERY = 5000
SYNC_EVERY_S = 1.0
USAGE_KEY = b'"usage":'
# A usage object is a few hundred bytes; a match whose object has not ended within this many is not one.
MAX_USAGE_BYTES = 4096
_DECODER = json.JSONDecoder()


def tokens_of(usage) -> tuple[int, int]:
    """(prompt, completion) of an OpenAI `usage` object: chat, completions and embeddings name them prompt_tokens and
    completion_tokens, the Responses API input_tokens and output_tokens."""
    if not isinstance(usage, dict):
        return 0, 0

    def count(*names):
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return 0
    return count("prompt_tokens", "input_tokens"), count("completion_tokens", "output_tokens")


class UsageScanner:
    """The last complete `"usage":{...}` of a body fed in pieces, found without keeping the body.

    Inside a JSON string a quote is escaped, so the bytes `"usage":` only ever start a key."""

    def __init__(self) -> None:
        self.usage = None
        self._carry = b""

    def feed(self, chunk: bytes) -> None:
        data = self._carry + chunk
        end = len(data)
        found = None
        pending = None
        while True:
            at = data.rfind(USAGE_KEY, 0, end)
            if at < 0:
                break
            value, complete = _decode_object(data, at + len(USAGE_KEY))
            if complete:
                found = value
                break
            if pending is None and len(data) - at <= MAX_USAGE_BYTES:
                pending = at  # cut at the end of this piece: decoded once the next one arrives
            end = at
        if isinstance(found, dict):
            self.usage = found
        if pending is not None:
            self._carry = data[pending:]
        else:
            self._carry = data[-(len(USAGE_KEY) - 1):]


def _decode_object(data: bytes, start: int):
    """(value, complete) of the JSON value at data[start:]; complete False when it may go on in the next piece."""
    text = data[start:start + MAX_USAGE_BYTES].decode("utf-8", "replace").lstrip()
    try:
        value, _end = _DECODER.raw_decode(text)
    except ValueError:
        return None, False
    return value, True


def fold(lines) -> dict:
    """{(day, client, model): [requests, prompt, completion]} of ledger lines; torn or foreign lines are skipped."""
    totals: dict = {}
    for line in lines:
        try:
            entry = json.loads(line)
            key = (str(entry["day"]), str(entry["client"]), str(entry["model"]))
            counts = [int(entry["requests"]), int(entry["prompt"]), int(entry["completion"])]
        except (ValueError, TypeError, KeyError):
            continue
        total = totals.setdefault(key, [0, 0, 0])
        for index, value in enumerate(counts):
            total[index] += value
    return totals


def ledger_line(day: str, client: str, model: str, counts) -> bytes:
    requests, prompt, completion = counts
    return (json.dumps({"day": day, "client": client, "model": model, "requests": requests, "prompt": prompt,
                        "completion": completion}, sort_keys=True) + "\n").encode()


def as_days(totals: dict) -> dict:
    """{day: {client: {model: [requests, prompt, completion]}}}: what GET /onprem/usage answers."""
    days: dict = {}
    for (day, client, model), counts in sorted(totals.items()):
        days.setdefault(day, {}).setdefault(client, {})[model] = list(counts)
    return days


class Ledger:
    """A deployment's counts on the host (usage.jsonl in its folder), shared by every server process that uses the
    folder, one writer at a time."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LEDGER)
        self._lock_fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = None
        self._appended = 0
        self._last_sync = 0.0
        self.ledger_id = self._read_or_make_id()
        self.compact()

    def _read_or_make_id(self) -> str:
        """A name for this ledger that outlives the server: the gateway keeps one copy of each ledger's counts, however
        many addresses reach it."""
        path = os.path.join(self.directory, LEDGER_ID)
        with _Locked(self._lock_fd):
            try:
                with open(path, encoding="ascii") as handle:
                    value = handle.read().strip()
                if re.match(r"^[0-9a-f]{32}$", value):
                    return value
            except OSError:
                pass
            value = uuid.uuid4().hex
            _write_atomically(path, (value + "\n").encode())
            return value

    def _append_fd(self) -> int:
        """The ledger open for appending; opened again when a compaction (this process's or another's) replaced it."""
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            current = None
        if self._fd is not None and current is not None and os.fstat(self._fd).st_ino == current:
            return self._fd
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return self._fd

    def add(self, day: str, client: str, model: str, counts) -> None:
        line = ledger_line(day, client, model, counts)
        with _Locked(self._lock_fd):
            fd = self._append_fd()
            os.write(fd, line)
            now = time.monotonic()
            if now - self._last_sync >= SYNC_EVERY_S:
                os.fsync(fd)
                self._last_sync = now
        self._appended += 1
        if self._appended >= COMPACT_EVERY:
            self.compact()

    def _read(self) -> bytes:
        try:
            with open(self.path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return b""

    def totals(self) -> dict:
        with _Locked(self._lock_fd):
            return fold(self._read().splitlines())

    def compact(self) -> None:
        """One line per day, client and model; the same counts, written aside and renamed over the ledger."""
        with _Locked(self._lock_fd):
            totals = fold(self._read().splitlines())
            _write_atomically(self.path, b"".join(ledger_line(day, client, model, counts)
                                                  for (day, client, model), counts in sorted(totals.items())))
        self._appended = 0


class _Locked:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _write_atomically(path: str, content: bytes) -> None:
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def client_of(headers) -> str:
    for name, value in headers or ():
        if name.lower() == CLIENT_HEADER:
            return value.decode() if CLIENT_NAME.match(value) else DIRECT
    return DIRECT


def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


class UsageMiddleware:
    def __init__(self, app, directory: str | None = None, model: str | None = None) -> None:
        self.app = app
        directory = directory or os.environ.get(USAGE_DIR_ENV, "")
        if not directory:
            raise RuntimeError("onprem_vllm_usage: %s is not set: refusing to serve uncounted" % USAGE_DIR_ENV)
        # A folder that cannot be written stops the server at start-up instead of serving uncounted.
        self.ledger = Ledger(directory)
        self.model = model or os.environ.get(MODEL_ENV, "") or "unknown"
        self._error = ""

    def record(self, client: str, usage) -> None:
        try:
            self.ledger.add(utc_day(), client, self.model, (1, *tokens_of(usage)))
        except OSError as exc:  # a full disk must not fail the answer already sent; said once
            if str(exc) != self._error:
                self._error = str(exc)
                print("onprem_vllm_usage: a request could not be counted: %s" % exc, file=sys.stderr, flush=True)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method = scope.get("method")
        if method == "GET" and scope.get("path") == USAGE_PATH:
            body = json.dumps({"ledger": self.ledger.ledger_id, "model": self.model,
                               "days": as_days(self.ledger.totals())}, sort_keys=True).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})
        if method != "POST":
            return await self.app(scope, receive, send)
        client = client_of(scope.get("headers"))
        scanner = UsageScanner()

        async def counting_send(message):
            if message["type"] == "http.response.body":
                scanner.feed(message.get("body", b""))
            await send(message)
        try:
            return await self.app(scope, receive, counting_send)
        finally:
            self.record(client, scanner.usage)
