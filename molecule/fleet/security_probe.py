# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP probes for security_checks.yml, run on a lab host. Reads the requests (with their keys) as JSON on stdin,
so no key is a process argument; prints one JSON line per request: name, status (0 = no HTTP answer), whether the
answer named a backend, whether it held a completion, and whether a text the answer must not hold ("absent") was
absent. A request may carry more headers and may send its body chunked (no Content-Length). Over https it trusts its
"cafile" only, and may present a client certificate ("cert", key "cert_key"; "cert": "stranger" is a self-signed one
made here, which no server trusts). A "raw_body" is sent as written (duplicate or escaped JSON keys). A "wire" request
is written on one socket byte for byte: its HTTP requests ("wire": [{path, body, key, version, pad}]) back to back
(pipelined), over TLS when the URL is https; its status is that of the last answer (0 when fewer answers came than
requests were sent), "statuses" all of them. A "hold" request writes its bytes ("hold": text, possibly a request head
that announces more body than it sends, or a TLS ClientHello cut short on a plain socket) and waits: its status is 0
when the gateway closed the connection within "within_s" seconds, -1 when it still held it; the holds run at once,
beside the other requests. Never prints a request's key."""
import concurrent.futures
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

STRANGER = tempfile.mkdtemp(prefix="security-probe-")


def stranger():
    """A client certificate of this host's own making: valid, but no server pins it."""
    cert, key = os.path.join(STRANGER, "stranger.crt"), os.path.join(STRANGER, "stranger.key")
    if not os.path.exists(cert):
        subprocess.run(["openssl", "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=stranger",
                        "-addext", "extendedKeyUsage=clientAuth"], check=True, capture_output=True)
    return cert, key


def wire(spec):
    """Several HTTP requests written at once on one connection, as a client on the wire may send them."""
    url = urllib.parse.urlsplit(spec["url"])
    data = b""
    for part in spec["wire"]:
        # "pad": that many bytes of prompt, made here (a body over a limit need not travel through Ansible).
        body = json.dumps(dict(part["body"], **({"prompt": "x" * part["pad"]} if part.get("pad") else {}))).encode()
        head = [f"POST {part['path']} {part.get('version', 'HTTP/1.1')}", f"Host: {url.hostname}",
                "Content-Type: application/json", f"Content-Length: {len(body)}"]
        if part.get("key") is not None:
            head.append("Authorization: Bearer " + part["key"])
        data += ("\r\n".join(head) + "\r\n\r\n").encode() + body
    sock = socket.create_connection((url.hostname, url.port), timeout=spec.get("timeout", 60))
    if url.scheme == "https":
        sock = ssl.create_default_context(cafile=spec.get("cafile")).wrap_socket(sock, server_hostname=url.hostname)
    answer = b""
    try:
        sock.sendall(data)
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:
        pass  # a reset after the answers: what came counts
    finally:
        sock.close()
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", answer)]
    return {"name": spec["name"], "statuses": statuses,
            "status": statuses[-1] if len(statuses) == len(spec["wire"]) else 0,
            "backend_header": b"x-onprem-backend" in answer.lower()}


def hold(spec):
    """Bytes that never make a whole request: the seconds until the gateway closes the connection."""
    url = urllib.parse.urlsplit(spec["url"])
    started = time.monotonic()
    sock = socket.create_connection((url.hostname, url.port), timeout=spec["within_s"])
    if url.scheme == "https" and not spec.get("raw_tls"):
        sock = ssl.create_default_context(cafile=spec.get("cafile")).wrap_socket(sock, server_hostname=url.hostname)
    answer = b""
    try:
        sock.sendall(spec["hold"].encode("latin-1"))
        while chunk := sock.recv(65536):
            answer += chunk
        closed = True
    except socket.timeout:
        closed = False
    except OSError:
        closed = True  # reset
    finally:
        sock.close()
    seconds = round(time.monotonic() - started, 1)
    return {"name": spec["name"], "status": 0 if closed and seconds <= spec["within_s"] else -1, "seconds": seconds,
            "answered": answer[:12].decode("latin-1")}


def one(spec):
    if spec.get("hold") is not None:
        return hold(spec)
    if spec.get("wire"):
        return wire(spec)
    headers = {"Content-Type": "application/json"}
    if spec.get("key") is not None:
        headers["Authorization"] = "Bearer " + spec["key"]
    headers.update(spec.get("headers") or {})
    body = json.dumps(spec["body"]).encode() if spec.get("body") is not None else None
    if spec.get("raw_body") is not None:
        body = spec["raw_body"].encode()
    if body is not None and spec.get("chunked"):
        body = iter([body[i:i + 65536] for i in range(0, len(body), 65536)])  # urllib sends it chunked
    context = ssl.create_default_context(cafile=spec["cafile"]) if spec.get("cafile") else None
    if context is not None and spec.get("cert"):
        context.load_cert_chain(*(stranger() if spec["cert"] == "stranger" else (spec["cert"], spec["cert_key"])))
    request = urllib.request.Request(spec["url"], data=body, headers=headers, method=spec.get("method", "POST"))
    deadline = time.monotonic() + spec.get("wait_s", 0)
    while True:
        try:
            with urllib.request.urlopen(request, timeout=spec.get("timeout", 60), context=context) as resp:
                status, names, text = resp.status, dict(resp.headers), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, names, text = exc.code, dict(exc.headers or {}), exc.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as exc:
            if time.monotonic() < deadline:
                time.sleep(1)
                continue
            return {"name": spec["name"], "status": 0, "error": type(exc).__name__}
        try:
            completion = bool(json.loads(text).get("choices"))
        except (ValueError, AttributeError):
            completion = False
        return {"name": spec["name"], "status": status, "completion": completion,
                "backend_header": any(h.lower() == "x-onprem-backend" for h in names),
                "absent": not spec.get("absent") or spec["absent"] not in text}


specs = json.load(sys.stdin)
with concurrent.futures.ThreadPoolExecutor(max(1, sum(1 for spec in specs if spec.get("hold") is not None))) as pool:
    held = {i: pool.submit(hold, spec) for i, spec in enumerate(specs) if spec.get("hold") is not None}
    answers = [held[i] if i in held else one(spec) for i, spec in enumerate(specs)]
for answer in answers:
    print(json.dumps(answer if isinstance(answer, dict) else answer.result()), flush=True)
