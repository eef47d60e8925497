# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's model finder (roles/gateway/files/onprem_model_finder.py): the streaming scan of a body for its
top-level model, fed whole and cut at every byte; the head it sends on; and a request end to end over real Unix
sockets, with a stand-in for HAProxy's routed socket that records what reached it and answers a stream."""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import random
import socket
import threading

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_SPEC = importlib.util.spec_from_file_location(
    "onprem_model_finder", os.path.join(ROOT, "roles", "gateway", "files", "onprem_model_finder.py"))
finder = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(finder)


def scan(body: bytes, piece: int = 0):
    scanner = finder.ModelScanner()
    if piece:
        for start in range(0, len(body), piece):
            scanner.feed(body[start:start + piece])
    else:
        scanner.feed(body)
    return scanner


def photo_chat(model_last=True, model="qwen3-vl-8b", kilobytes=64):
    """A chat body as a client that writes messages first sends it: a base64 photo, nested keys named model."""
    photo = base64.b64encode(random.Random(kilobytes).randbytes(kilobytes * 1024)).decode()
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + photo, "model": "not-this"}},
        {"type": "text", "text": 'What is "model": "wrong" \\ here? {[,:]}'}]}]
    fields = [("messages", messages), ("max_tokens", 8), ("stream", True), ("metadata", {"model": "nested"})]
    fields = fields + [("model", model)] if model_last else [("model", model)] + fields
    return json.dumps(dict(fields)).encode()


@pytest.mark.parametrize("piece", [0, 1, 7, 4096])
def test_the_scanner_finds_the_top_level_model_wherever_the_body_is_cut(piece):
    """The top-level model after a 64 KB photo, strings with quotes, backslashes and brackets, and nested keys named
    model; fed whole, a byte at a time and in odd pieces."""
    assert scan(photo_chat(), piece).model == "qwen3-vl-8b"
    assert scan(photo_chat(model_last=False), piece).model == "qwen3-vl-8b"


def test_the_scanner_reads_the_first_model_escaped_names_and_stops_at_it():
    assert scan(b'{"model": "a", "model": "b"}').model == "a"  # as HAProxy's json_query
    assert scan(b'{"model":"caf\\u00e9/x\\"y"}').model == 'caf\u00e9/x"y'
    scanner = scan(b'{"model": "a", "rest": ')  # found before the body ends: done, the rest unread
    assert scanner.done and scanner.model == "a"
    assert scan(b'{"n": -1.5e3, "t": true, "x": null, "model": "m"}').model == "m"
    assert scan(b'{"models": "no", "mode": "no", "model": "yes"}').model == "yes"


def test_a_body_without_a_top_level_model_string_has_none():
    for body in (b'{"messages": [{"model": "nested"}]}', b'{"model": 3}', b'{}', b'{"input": "x"'):
        assert scan(body).model is None, body
    assert scan(b'{"messages": []}').done  # the object ended
    with pytest.raises(finder.RequestError) as error:
        scan(b'[{"model": "m"}]')
    assert error.value.status == 400
    with pytest.raises(finder.RequestError, match="not a model name"):
        scan(b'{"model": "' + b"x" * 600 + b'"}')


def test_the_head_sent_on_keeps_the_key_and_sets_the_model_and_length():
    line, headers, length, chunked = finder.parse_head(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer client-key\r\n"
        b"Content-Length: 12\r\nConnection: keep-alive\r\nX-Onprem-Routed-Model: forged\r\nExpect: 100-continue")
    assert (line, length, chunked) == (b"POST /v1/chat/completions HTTP/1.1", 12, False)
    head = finder.forward_head(line, headers, 'caf\u00e9"x', 34)
    assert head.endswith(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == line and b"authorization: Bearer client-key" in lines
    assert b'x-onprem-routed-model: caf\\u00e9\\"x' in lines and b"content-length: 34" in lines
    assert b"connection: close" in lines and b"x-onprem-routed-model: forged" not in lines
    assert not any(line.startswith(b"expect") for line in lines)
    assert not any(name.startswith(b"connection: keep") or name == b"content-length: 12" for name in lines)
    for bad in (b"GET /\r\nHost: x", b"POST / HTTP/1.1\r\nContent-Length: x1",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip", b"POST / HTTP/1.1\r\nBad Header"):
        with pytest.raises(finder.RequestError):
            finder.parse_head(bad)


@pytest.fixture
def routed(tmp_path):
    """A stand-in for HAProxy's routed socket: records each request's head and body, answers a chunked stream."""
    path = str(tmp_path / "routed.sock")
    seen = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _address = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _blank, body = data.partition(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.startswith(b"content-length:")][0].split(b":")[1])
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append((head, body))
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             b"6\r\ndata: \r\n0\r\n\r\n")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, seen
    listener.close()


def ask(routed_path, spool, request: bytes, max_body_bytes=16 * 1024 * 1024) -> bytes:
    client, server = socket.socketpair()
    worker = threading.Thread(target=finder.handle, args=(server, routed_path, spool, max_body_bytes))
    worker.start()
    client.sendall(request)
    answer = b""
    worker.join(30)
    server.close()
    client.settimeout(5)
    while True:
        piece = client.recv(65536)
        if not piece:
            break
        answer += piece
    client.close()
    return answer


def test_a_large_photo_chat_is_spooled_sent_on_with_its_model_and_its_stream_relayed(routed, tmp_path):
    path, seen = routed
    body = photo_chat(kilobytes=3 * 1024)  # a 3 MB photo, 4 MB of base64: model after it
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    answer = ask(path, str(tmp_path), head + body)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"6\r\ndata: \r\n0\r\n\r\n")
    (sent_head, sent_body), = seen
    assert sent_body == body and b"x-onprem-routed-model: qwen3-vl-8b" in sent_head.split(b"\r\n")
    assert os.listdir(tmp_path) == ["routed.sock"]  # nothing of the body left in the spool folder
    # chunked, in chunks of uneven sizes
    pieces, start = [], 0
    while start < len(body):
        size = 1000 + start % 7
        pieces.append(body[start:start + size])
        start += size
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert ask(path, str(tmp_path), head + chunks).startswith(b"HTTP/1.1 200 OK")
    assert seen[1][1] == body and b"content-length: %d" % len(body) in seen[1][0].split(b"\r\n")


def test_no_model_and_a_body_over_the_limit_get_openai_errors_and_reach_nothing(routed, tmp_path):
    path, seen = routed
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    answer = ask(path, str(tmp_path), b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {
        "error": {"message": "no model in the request", "type": "BadRequestError", "code": 400}}
    answer = ask(path, str(tmp_path), b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5000\r\n\r\n",
                 max_body_bytes=4096)
    assert answer.startswith(b"HTTP/1.1 413 ")
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"800\r\n" + b"{" + b" " * 2047 + b"\r\n"
    assert ask(path, str(tmp_path), chunked * 1 + b"800\r\n" + b" " * 2048 + b"\r\n0\r\n\r\n",
               max_body_bytes=3000).startswith(b"HTTP/1.1 413 ")
    assert seen == []
