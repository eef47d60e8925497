# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two checks of a running server that no module of the collection makes on its own host (standard library only):

keys   Every route vLLM serves (its /openapi.json, read with the key) is asked without a key and with a wrong one:
       each answers 401 except the probes the middleware leaves open (GET /health, /ping, /version, /metrics), which
       must not. Prints one JSON line: the routes tried and any that answered otherwise.
drain  The orderly-shutdown drain (roles/vllm_server/files/onprem_vllm_drain.py, as onprem-vllm-drain.service runs
       it) against the server while a stand-in gateway checks /health with the key every second (as HAProxy's check
       does: `X-Onprem-Check: <name>;fall=<n>`) and one streamed completion is in flight: the drain must wait until
       the gateway's checks were refused `fall` times and the completion finished, and the completion must end
       whole. Prints one JSON line. The drain flag is removed afterwards (the server serves again).
The key is read from the server's key file (first line), never from an argument.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

OPEN_GET = {"/health", "/ping", "/version", "/metrics"}


def request(url: str, method: str = "GET", key: str | None = None, body: bytes | None = None,
            headers: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    all_headers = dict(headers or {})
    if key is not None:
        all_headers["Authorization"] = "Bearer " + key
    if body is not None:
        all_headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=body, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def read_key(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.readline().strip()


def check_keys(base: str, key: str) -> dict:
    status, body = request(base + "/openapi.json", key=key)
    if status != 200:
        return {"ok": False, "why": f"/openapi.json with the key answered {status}"}
    routes = []
    for path, methods in sorted(json.loads(body)["paths"].items()):
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        routes += [(method.upper(), concrete) for method in sorted(methods)]
    wrong = []
    for method, path in routes:
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        for label, credential in (("no key", None), ("a wrong key", "not-" + key[:4])):
            status = request(base + path, method=method, key=credential, body=body, timeout=60)[0]
            # /health with a key the server does not hold is a gateway's misconfigured check: 401 (it leaves rotation)
            expected_open = method in ("GET", "HEAD") and path in OPEN_GET and not (path == "/health" and credential)
            if (status == 401) == expected_open:
                wrong.append(f"{method} {path} with {label}: {status}")
    # The gate itself: the server answers with the key (no route needs a second secret).
    status = request(base + "/v1/models", key=key)[0]
    if status != 200:
        wrong.append(f"GET /v1/models with the key: {status}")
    return {"ok": not wrong, "routes": len(routes), "requests": 2 * len(routes) + 1, "answered_otherwise": wrong,
            "open": sorted(OPEN_GET)}


def check_drain(base: str, key: str, model: str, drain_script: str, flag: str, fall: int, min_wait: float) -> dict:
    stop = threading.Event()
    checks = []

    def gateway():
        while not stop.is_set():
            status = request(base + "/health", key=key, headers={"X-Onprem-Check": f"gpu-gw;fall={fall}"},
                             timeout=5)[0]
            checks.append((time.monotonic(), status))
            stop.wait(1.0)

    streamed = {}

    def completion():
        body = json.dumps({"model": model, "stream": True, "max_tokens": 3000, "ignore_eos": True,
                           "messages": [{"role": "user", "content": "Count slowly."}]}).encode()
        started = time.monotonic()
        status, text = request(base + "/v1/chat/completions", method="POST", key=key, body=body, timeout=300)
        streamed.update(status=status, done=text.rstrip().endswith(b"data: [DONE]"),
                        chunks=text.count(b"data: "), started=started, ended=time.monotonic())

    checker = threading.Thread(target=gateway, daemon=True)
    checker.start()
    time.sleep(3)  # the gateway is known to the server before the drain
    client = threading.Thread(target=completion, daemon=True)
    client.start()
    time.sleep(0.5)
    began = time.monotonic()
    drain = subprocess.run([sys.executable, drain_script, "--flag", flag, "--server", base, "--min-wait",
                            str(min_wait), "--timeout", "120"], capture_output=True, text=True, check=False)
    drained = time.monotonic()
    client.join(300)
    stop.set()
    checker.join(10)
    refused_before = sum(1 for at, status in checks if began <= at <= drained and status == 503)
    os.unlink(flag)
    status_after = request(base + "/health", timeout=5)[0]
    report = json.loads(drain.stderr.split("onprem-vllm-drain: ", 1)[1]) if "onprem-vllm-drain: " in drain.stderr \
        else {"stderr": drain.stderr[-400:]}
    ok = (drain.returncode == 0 and not report.get("timeout", True) and refused_before >= fall
          and streamed.get("status") == 200 and streamed.get("done") and streamed.get("ended", 1e18) <= drained
          and status_after == 200)
    return {"ok": bool(ok), "drain": report, "drain_s": round(drained - began, 1),
            "gateway_checks_refused_during_drain": refused_before, "fall": fall,
            "completion": {"status": streamed.get("status"), "ended_with_done": streamed.get("done"),
                           "chunks": streamed.get("chunks"),
                           "ended_before_drain_returned": streamed.get("ended", 1e18) <= drained},
            "health_after_flag_removed": status_after}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["keys", "drain"])
    parser.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--model", default="", help="the served model name (drain)")
    parser.add_argument("--drain-script", default="", help="onprem_vllm_drain.py (drain)")
    parser.add_argument("--flag", default="/run/onprem-vllm-drain/draining", help="the drain flag (drain)")
    parser.add_argument("--fall", type=int, default=3, help="the stand-in gateway's fall (drain)")
    parser.add_argument("--min-wait", type=float, default=5.0, help="the drain's --min-wait (drain)")
    args = parser.parse_args(argv)
    base, key = args.url.rstrip("/"), read_key(args.key_file)
    result = check_keys(base, key) if args.check == "keys" else check_drain(
        base, key, args.model, args.drain_script, args.flag, args.fall, args.min_wait)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
