# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A steady stream of chat completions (or embeddings) through the fleet gateway, counted: the client's view of a
rollout.

  python3 benchmarks/prober.py --url https://172.30.97.5:4000 --cafile GATEWAY_CERT --key-file KEYFILE \
      --model qwen3-30b-a3b --max-requests 5000 --max-seconds 900 --out prober.json [--stop-file FILE] \
      [--endpoint embeddings]

Standard library only. Bounded: it stops at --max-requests, after --max-seconds, or when --stop-file appears,
whichever comes first. It only talks to loopback or private (lab) addresses. The API key comes from a file (or the
PROBER_API_KEY environment variable), never from the command line. The JSON result holds the counts, status codes,
latency percentiles, which backend answered (the gateway's X-Onprem-Backend header) and a per-second timeline.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path


class ProbeError(Exception):
    pass


def check_target(url: str) -> None:
    """Refuse anything but loopback and private-network addresses: this tool must not load other people's servers."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise ProbeError(f"cannot resolve {host!r}: {exc}") from exc
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if not (ip.is_loopback or ip.is_private) or ip.is_link_local:
            raise ProbeError(f"{host} resolves to {address}, which is not a loopback or private lab address: refused")


def percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return round(ordered[index], 3)


class Prober:
    def __init__(self, args, key: str):
        self.args = args
        self.key = key
        self.lock = threading.Lock()
        self.started = time.time()
        self.deadline = time.monotonic() + args.max_seconds
        self.sent = 0
        self.ok = 0
        self.failed = 0
        self.statuses: dict[str, int] = {}
        self.backends: dict[str, int] = {}
        self.errors: list[dict] = []
        self.latencies: list[float] = []
        self.timeline: dict[int, dict] = {}
        self.stop = threading.Event()
        # HTTPS: the gateway's certificate is verified (against --cafile, else the system's CAs); a server over mutual
        # TLS also wants a client certificate (cert, cert_key: the gateway's, where the caller runs on its host).
        self.context = ssl.create_default_context(cafile=args.cafile) if args.url.startswith("https:") else None
        if self.context is not None and getattr(args, "cert", None):
            self.context.load_cert_chain(args.cert, args.cert_key)

    def take_slot(self) -> bool:
        with self.lock:
            if self.sent >= self.args.max_requests or time.monotonic() >= self.deadline or self.stop.is_set():
                return False
            if self.args.stop_file and Path(self.args.stop_file).exists():
                self.stop.set()
                return False
            self.sent += 1
            return True

    def one_request(self) -> tuple[int, str, str]:
        if self.args.endpoint == "embeddings":
            path, answer = "/v1/embeddings", "data"
            body = json.dumps({"input": "Say hello.", "model": self.args.model}).encode()
        else:
            path, answer = "/v1/chat/completions", "choices"
            body = json.dumps({"model": self.args.model, "max_tokens": self.args.max_tokens,
                               "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        req = urllib.request.Request(f"{self.args.url.rstrip('/')}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=self.args.request_timeout, context=self.context) as resp:
                payload = json.loads(resp.read().decode())
                if not payload.get(answer):
                    return resp.status, resp.headers.get("X-Onprem-Backend", ""), f"no {answer} in the answer"
                return resp.status, resp.headers.get("X-Onprem-Backend", ""), ""
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("X-Onprem-Backend", "") if exc.headers else "", \
                exc.read().decode(errors="replace")[:200]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return 0, "", str(exc)[:200]

    def record(self, began: float, status: int, backend: str, error: str) -> None:
        elapsed = time.monotonic() - began
        second = int(time.time() - self.started)
        good = status == 200 and not error
        with self.lock:
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
            slot = self.timeline.setdefault(second, {"ok": 0, "failed": 0, "backends": {}})
            if good:
                self.ok += 1
                self.latencies.append(elapsed)
                slot["ok"] += 1
                if backend:
                    self.backends[backend] = self.backends.get(backend, 0) + 1
                    slot["backends"][backend] = slot["backends"].get(backend, 0) + 1
            else:
                self.failed += 1
                slot["failed"] += 1
                if len(self.errors) < 50:
                    self.errors.append({"t": round(time.time() - self.started, 2), "status": status,
                                        "backend": backend, "error": error})

    def worker(self) -> None:
        while self.take_slot():
            began = time.monotonic()
            status, backend, error = self.one_request()
            self.record(began, status, backend, error)
            if self.args.interval > 0:
                time.sleep(self.args.interval)

    def run(self) -> dict:
        threads = [threading.Thread(target=self.worker, daemon=True) for _i in range(self.args.concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = self.ok + self.failed
        return {
            "url": self.args.url, "model": self.args.model, "concurrency": self.args.concurrency,
            "started_at": self.started, "duration_s": round(time.time() - self.started, 1),
            "requests": total, "ok": self.ok, "failed": self.failed,
            "success_rate": round(self.ok / total, 6) if total else None,
            "statuses": self.statuses, "backends": self.backends,
            "latency_s": {"p50": percentile(self.latencies, 50), "p95": percentile(self.latencies, 95),
                          "max": round(max(self.latencies), 3) if self.latencies else None},
            "errors": self.errors,
            "stopped_by": ("stop file" if self.stop.is_set() else "max requests" if self.sent >= self.args.max_requests
                           else "max seconds"),
            "timeline": {str(k): v for k, v in sorted(self.timeline.items())},
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="gateway base URL (loopback or private address)")
    parser.add_argument("--key-file", type=Path, help="file holding the client API key (else $PROBER_API_KEY)")
    parser.add_argument("--cafile", help="PEM certificate(s) an https gateway's certificate is verified against")
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", choices=["chat", "embeddings"], default="chat",
                        help="chat completions, or embeddings (a pooling deployment)")
    parser.add_argument("--max-requests", type=int, default=5000)
    parser.add_argument("--max-seconds", type=float, default=900)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.2, help="pause of each worker between two requests")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--request-timeout", type=float, default=120)
    parser.add_argument("--stop-file", help="stop as soon as this file exists")
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    args = parser.parse_args(argv)
    try:
        if not 1 <= args.concurrency <= 16 or not 1 <= args.max_requests <= 100000 or not 0 < args.max_seconds <= 7200:
            raise ProbeError("bounds: concurrency 1..16, max-requests 1..100000, max-seconds (0, 7200]")
        key = args.key_file.read_text().strip() if args.key_file else os.environ.get("PROBER_API_KEY", "")
        if not key:
            raise ProbeError("no API key: --key-file or PROBER_API_KEY")
        check_target(args.url)
        result = Prober(args, key).run()
    except ProbeError as exc:
        print(f"prober: {exc}", file=sys.stderr)
        return 2
    tmp = args.out.with_suffix(".partial")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)
    print(f"prober: {result['requests']} requests, {result['ok']} ok, {result['failed']} failed, "
          f"p95 {result['latency_s']['p95']} s, backends {result['backends']}")
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
