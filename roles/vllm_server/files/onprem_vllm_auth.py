# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bearer-key guard for every vLLM route (`vllm serve --middleware onprem_vllm_auth.BearerKeyMiddleware`).

vLLM's own --api-key guards only paths under /v1, /v2, /inference and /cohere: /invocations, /tokenize, /pooling,
/classify, /score, /rerank, ... answer anyone. This pure-ASGI middleware (standard library only, so it loads in any
vLLM image) refuses every request without `Authorization: Bearer <key>` except the read-only probes in OPEN_PATHS
and CORS preflights. The keys come from a file, one per line (the role mounts its 0600 file's folder read-only), never
from argv or the environment: the current key and, during a rotation, the other one, each accepted alike. The file is
read again whenever it changes (one stat per guarded request), so a key rotation restarts no server. A missing file or
one without a key stops the server at startup instead of serving unguarded; later, such a file keeps the keys last read
(and says so once on stderr).

While the host's drain flag exists (ONPREM_VLLM_DRAIN_FILE; files/onprem_vllm_drain.py writes it when the host shuts
down), GET /health answers 503: the gateways' health checks take the host out of rotation while the requests it
already has finish, before vLLM itself is stopped. A gateway's check says who it is and after how many failed checks
it stops sending (`X-Onprem-Check: <gateway>;fall=<n>`), and GET /onprem/drain (open: counts and gateway names only)
tells the drain how many checks each gateway has had refused and how many requests the server is answering, so the
drain waits for the gateways' own verdict instead of a guessed time. The server remembers every gateway that checks
it, before a drain too: a gateway that was checking when the drain began is waited for from the first poll, not only
once its next check arrives.

A gateway's check carries the gateway's key, and proves it: a check whose key this server does not hold is answered 401
(the gateway takes the server out of rotation instead of sending it requests it would refuse, and its exporter's
check code says why), and the check header counts only with a key this server holds (a host on the LAN cannot end a
drain early or fill the table with invented gateways). A probe without any key (the container's health check, the
role's gates) is answered as before.

The GPU fault flag (ONPREM_VLLM_FAULT_FILE; the Xid monitor writes it on a critical Xid) fails /health the same way,
but it lives on disk: the host stays out of rotation across restarts until playbooks/gpu_return.yml removes it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import sys
import time

KEY_FILE_ENV = "ONPREM_VLLM_API_KEY_FILE"
DRAIN_FILE_ENV = "ONPREM_VLLM_DRAIN_FILE"
FAULT_FILE_ENV = "ONPREM_VLLM_FAULT_FILE"
DEFAULT_KEY_FILE = "/run/secrets/onprem-vllm/api-key"
# Liveness, readiness and Prometheus: no inference, no tokenizer, no prompt. Exact paths, GET/HEAD only.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/metrics/"})
OPEN_METHODS = frozenset({"GET", "HEAD"})
DRAIN_STATUS_PATH = "/onprem/drain"
CHECK_HEADER = b"x-onprem-check"
CHECK_VALUE = re.compile(rb"^([A-Za-z0-9_.-]{1,64});fall=([0-9]{1,3})$")
# Only holders of a key count, and still a bounded table.
MAX_CHECKERS = 64
_UNAUTHORIZED = json.dumps({"error": {"message": "missing or wrong API key", "type": "invalid_request_error",
                                      "code": 401}}).encode()
_CHECK_KEY_REFUSED = json.dumps({"error": {
    "message": "a health check with a key this server does not hold: the caller's key is missing from the server's "
               "key file",
    "type": "invalid_request_error", "code": 401}}).encode()
_DRAINING = json.dumps({"status": "draining: the host is shutting down"}).encode()
_GPU_FAULT = json.dumps({"status": "out of rotation: a GPU of this host reported a critical Xid"}).encode()


def read_keys(path: str) -> list[bytes]:
    with open(path, "rb") as handle:
        keys = [line.strip() for line in handle.read().splitlines() if line.strip()]
    if not keys:
        raise RuntimeError(f"the API key file {path} is empty: refusing to serve without a key")
    return keys


class BearerKeyMiddleware:
    def __init__(self, app, key_file: str | None = None, drain_file: str | None = None,
                 fault_file: str | None = None) -> None:
        self.app = app
        self.drain_file = drain_file or os.environ.get(DRAIN_FILE_ENV, "")
        self.fault_file = fault_file or os.environ.get(FAULT_FILE_ENV, "")
        # Requests past the guard and not answered yet (streams until their last chunk); every keyed gateway's
        # {gateway: [checks refused while the host drains, the gateway's fall, when its last check came (monotonic)]}.
        self.in_flight = 0
        self.refused: dict[str, list] = {}
        self.key_file = key_file or os.environ.get(KEY_FILE_ENV, DEFAULT_KEY_FILE)
        self._key_stamp = None
        self._key_error = ""
        self._digests: list[bytes] = []
        self.reload_keys(startup=True)

    def reload_keys(self, startup: bool = False) -> None:
        """Read the key file again if it changed (the role replaces it atomically: a new inode)."""
        try:
            st = os.stat(self.key_file)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._key_stamp:
                return
            keys = read_keys(self.key_file)
        except (OSError, RuntimeError) as exc:
            if startup:
                raise
            if str(exc) != self._key_error:
                self._key_error = str(exc)
                print("onprem_vllm_auth: the key file cannot be read again, the keys read before stay: %s" % exc,
                      file=sys.stderr, flush=True)
            return
        # Compare digests of equal length in constant time (as vLLM's own middleware does), against every key: the
        # time taken does not say which key matched.
        self._digests = [hashlib.sha256(key).digest() for key in keys]
        self._key_stamp, self._key_error = stamp, ""

    def key_verdict(self, headers) -> bool | None:
        """True: a bearer key this server holds; False: another credential; None: no Authorization header."""
        self.reload_keys()
        for name, value in headers or ():
            if name.lower() == b"authorization":
                scheme, _separator, token = value.partition(b" ")
                digest = hashlib.sha256(token).digest()
                matches = [hmac.compare_digest(digest, known) for known in self._digests]
                return scheme.lower() == b"bearer" and any(matches)
        return None

    def authorized(self, headers) -> bool:
        return self.key_verdict(headers) is True

    @staticmethod
    def is_open(scope) -> bool:
        method = scope.get("method", "")
        if method == "OPTIONS":
            return True  # CORS preflight: no route does any work for it
        path = scope.get("path", "")
        root_path = scope.get("root_path", "")
        if root_path and path.startswith(root_path):
            path = path[len(root_path):]
        return method in OPEN_METHODS and path in OPEN_PATHS

    def gpu_fault(self) -> bool:
        return bool(self.fault_file) and os.path.exists(self.fault_file)

    def draining(self) -> bool:
        return (bool(self.drain_file) and os.path.exists(self.drain_file)) or self.gpu_fault()

    def health_check(self, scope, keyed: bool = False) -> bool:
        """GET /health: a keyed gateway's check is noted (who, its fall, when); while the host drains it is refused
        and counted."""
        draining = self.draining()
        for name, value in (scope.get("headers") or ()) if keyed else ():
            match = CHECK_VALUE.match(value) if name.lower() == CHECK_HEADER else None
            if match and (match.group(1).decode() in self.refused or len(self.refused) < MAX_CHECKERS):
                entry = self.refused.setdefault(match.group(1).decode(), [0, 0, 0.0])
                entry[0] = entry[0] + 1 if draining else 0  # back in service: a later drain counts afresh
                entry[1:] = [int(match.group(2)), time.monotonic()]
        return draining

    def drain_status(self) -> bytes:
        draining, now = self.draining(), time.monotonic()
        return json.dumps({"draining": draining, "gpu_fault": self.gpu_fault(), "in_flight": self.in_flight,
                           "checks": {name: {"refused": refused, "fall": fall, "idle_s": round(now - last, 1)}
                                      for name, (refused, fall, last) in self.refused.items()}
                           }).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)  # lifespan
        if scope["type"] == "http" and scope.get("method") == "GET":
            if scope.get("path") == "/health":
                verdict = self.key_verdict(scope.get("headers"))
                if verdict is False:
                    return await _reply(send, 401, _CHECK_KEY_REFUSED, [(b"www-authenticate", b"Bearer")])
                if self.health_check(scope, keyed=verdict is True):
                    return await _reply(send, 503, _GPU_FAULT if self.gpu_fault() else _DRAINING)
            if scope.get("path") == DRAIN_STATUS_PATH:
                return await _reply(send, 200, self.drain_status())
        if scope["type"] == "http" and self.is_open(scope):
            return await self.app(scope, receive, send)
        if self.authorized(scope.get("headers")):
            self.in_flight += 1
            try:
                return await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        return await _reply(send, 401, _UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])


async def _reply(send, status: int, body: bytes, headers=()) -> None:
    """A JSON answer the middleware gives itself (the app never sees the request)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
