# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's model finder: routes a request whose `model` HAProxy did not find in the part of the body it buffered.

Standard library only: it runs on the gateway host as a systemd service (onprem-model-finder.service), started as root
and at once HAProxy's own user (user_id, group_id), which is all it needs: its socket and HAProxy's routed socket are
in HAProxy's runtime folder.

HAProxy buffers at most gateway_request_buffer_size bytes of a body to read its `model`. A client that writes `model`
after a long field (a chat with base64 photos in `messages`, an embedding batch in `input`) sends a body whose model
is beyond that part. HAProxy then passes the request (the client's key checked and its limits applied) to this
service on a Unix socket, which:
  - reads the body once, in chunks of CHUNK bytes, through ModelScanner: a JSON tokenizer that keeps only its nesting
    state and the top-level key it is in, so a 10 MB base64 photo costs no memory, and stops collecting at the first
    top-level "model" string, as HAProxy's json_query does;
  - spools the body to an unnamed temporary file (O_TMPFILE in a folder only its user can open: nothing of it outlives
    the request, even when the host loses power);
  - sends the request again to HAProxy, on a second Unix socket that only HAProxy's user and root can open, with the
    model found in X-Onprem-Routed-Model, which HAProxy trusts there only. HAProxy then checks the key, the grant and
    the budget, and routes, exactly as for any request;
  - relays HAProxy's answer byte for byte (a stream stays a stream).
Memory per request is bounded by design (a few chunks, whatever the body's size); HAProxy's maxconn on this service's
server bounds the requests at once (more wait in HAProxy's queue). A body without a `model` at the top level gets
OpenAI's 400, one larger than --max-body-bytes OpenAI's 413.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import sys
import tempfile

CHUNK = 65536
# The longest request head accepted (HAProxy's tune.bufsize bounds what it sends much lower by default).
MAX_HEAD = 65536
# A model name longer than this is not one (no served name is longer than 128 bytes; escapes may double it).
MAX_MODEL = 512
ROUTED_HEADER = b"x-onprem-routed-model"
# Hop-by-hop and length headers: this service sets its own for the request it sends on.
# Expect: the body comes at once, no interim answer is awaited.
_DROPPED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"trailer",
                      b"upgrade", b"proxy-connection", b"expect", ROUTED_HEADER})
# A body that stops arriving for this long ends its request (HAProxy's own timeouts bound the rest).
BODY_IDLE_SECONDS = 60


class RequestError(Exception):
    """A request this service answers itself: (status, OpenAI error type, message)."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


# ---- pure: the streaming scan ----------------------------------------------------------------------------------------

class ModelScanner:
    """Finds the first top-level "model" string of a JSON object fed in pieces, holding only the top-level key being
    read (at most a few bytes of it) and the model's own characters. Not a validator: HAProxy and vLLM judge the body;
    a mis-scan cannot reach another deployment, since each backend answers to its own names only.
    After feed(), model is the name (None until found) and done is true once it was found or the object ended."""

    def __init__(self):
        self.model = None
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._expect_key = False
        self._value_pending = False  # a top-level ':' was read, its value not begun
        self._last_key = b""
        self._key = None  # the top-level key being read
        self._collect = None  # the model's characters being read

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.done:
                return
            self._step(byte)

    def _step(self, byte: int) -> None:
        if self._in_string:
            if self._collect is not None:
                self._collect.append(byte)
                if len(self._collect) > MAX_MODEL:
                    raise RequestError(400, "BadRequestError", "the request's model is not a model name")
            elif self._key is not None and len(self._key) < 16:  # only "model" matters
                self._key.append(byte)
            if self._escape:
                self._escape = False
            elif byte == 0x5C:  # backslash
                self._escape = True
            elif byte == 0x22:  # the closing quote
                self._in_string = False
                self._end_string()
            return
        if byte in b" \t\r\n":
            return
        if self._depth == 0:
            if byte != 0x7B:
                raise RequestError(400, "BadRequestError", "the request body is not a JSON object")
            self._depth, self._expect_key = 1, True
            return
        top = self._depth == 1
        if byte == 0x22:
            self._in_string = True
            if top and self._expect_key:
                self._key = bytearray(b'"')
            elif top and self._value_pending and self._last_key == b'"model"':
                self._collect = bytearray(b'"')
            self._value_pending = False
        elif byte in b"{[":
            self._depth += 1
            self._value_pending = False
        elif byte in b"}]":
            self._depth -= 1
            if self._depth == 0:
                self.done = True  # the object ended without a model
        elif top and byte == 0x3A:  # ':'
            self._value_pending = True
        elif top and byte == 0x2C:  # ','
            self._expect_key = True
        else:  # a number, true, false or null
            self._value_pending = False

    def _end_string(self) -> None:
        if self._key is not None:
            self._last_key, self._key, self._expect_key = bytes(self._key), None, False
        elif self._collect is not None:
            try:
                model = json.loads(bytes(self._collect).decode("utf-8"))
            except ValueError:
                raise RequestError(400, "BadRequestError", "the request's model is not a valid JSON string") from None
            self.model, self.done, self._collect = model, True, None


def parse_head(head: bytes) -> tuple:
    """(request line, [(name, value)], content length or None, chunked) of a request head (its CRLF CRLF excluded)."""
    lines = head.split(b"\r\n")
    if len(lines[0].split(b" ")) != 3:
        raise RequestError(400, "BadRequestError", "malformed request line")
    headers, length, chunked = [], None, False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise RequestError(400, "BadRequestError", "malformed request header")
        name, value = name.lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise RequestError(400, "BadRequestError", "malformed Content-Length")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.lower() == b"chunked"
            if not chunked:
                raise RequestError(400, "BadRequestError", "unsupported Transfer-Encoding")
        headers.append((name, value))
    return lines[0], headers, length, chunked


def forward_head(request_line: bytes, headers: list, model: str, length: int) -> bytes:
    """The head of the request sent on to HAProxy: the client's headers (its key among them) without the hop-by-hop and
    length ones, the model found, the spooled length, and one request per connection."""
    kept = [b"%s: %s" % (name, value) for name, value in headers if name not in _DROPPED]
    routed = json.dumps(model)[1:-1].encode("utf-8")  # printable ASCII: JSON-escaped, quotes dropped
    return b"\r\n".join([request_line] + kept + [
        ROUTED_HEADER + b": " + routed, b"content-length: %d" % length, b"connection: close", b"", b""])


def error_answer(error: RequestError) -> bytes:
    """OpenAI's error object as a whole HTTP/1.1 answer."""
    body = json.dumps({"error": {"message": error.message, "type": error.kind, "code": error.status}}).encode()
    reason = {400: "Bad Request", 413: "Payload Too Large", 502: "Bad Gateway"}.get(error.status, "Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (error.status, reason.encode(), len(body))) + body


# ---- I/O: one request per connection ---------------------------------------------------------------------------------

class _Reader:
    """Buffered reads of a socket: the head, then the body as Content-Length or chunked says."""

    def __init__(self, sock):
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(CHUNK)
        self.buffer += data
        return bool(data)

    def until(self, marker: bytes, limit: int) -> bytes:
        while marker not in self.buffer:
            if len(self.buffer) > limit or not self._fill():
                raise RequestError(400, "BadRequestError", "incomplete or oversized request head")
        head, _marker, self.buffer = self.buffer.partition(marker)
        return head

    def exactly(self, count: int):
        while count > 0:
            if not self.buffer and not self._fill():
                raise RequestError(400, "BadRequestError", "the request body ended early")
            piece, self.buffer = self.buffer[:count], self.buffer[count:]
            count -= len(piece)
            yield piece

    def chunked(self):
        while True:
            size_line = self.until(b"\r\n", 1024)
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise RequestError(400, "BadRequestError", "malformed chunk size") from None
            if size == 0:
                while self.until(b"\r\n", MAX_HEAD):  # trailer lines, up to the empty one
                    pass
                return
            yield from self.exactly(size)
            self.exactly_drop(2)

    def exactly_drop(self, count: int) -> None:
        for _piece in self.exactly(count):
            pass


def handle(client, routed_socket: str, spool_dir: str, max_body_bytes: int) -> None:
    """One request from HAProxy: scan and spool its body, send it on with its model, relay the answer."""
    try:
        client.settimeout(BODY_IDLE_SECONDS)
        reader = _Reader(client)
        request_line, headers, length, chunked = parse_head(reader.until(b"\r\n\r\n", MAX_HEAD))
        too_large = RequestError(413, "RequestTooLargeError",
                                 "The request body is larger than the gateway accepts (%d bytes)." % max_body_bytes)
        if length is not None and length > max_body_bytes:
            raise too_large
        scanner, size = ModelScanner(), 0
        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            for piece in (reader.chunked() if chunked else reader.exactly(length or 0)):
                size += len(piece)
                if size > max_body_bytes:
                    raise too_large
                if not scanner.done:
                    scanner.feed(piece)
                spool.write(piece)
            if scanner.model is None:
                raise RequestError(400, "BadRequestError", "no model in the request")
            spool.seek(0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                upstream.settimeout(None)
                try:
                    upstream.connect(routed_socket)
                except OSError as exc:
                    raise RequestError(502, "APIConnectionError", "the gateway's routed socket: %s" % exc) from None
                upstream.sendall(forward_head(request_line, headers, scanner.model, size))
                while True:
                    piece = spool.read(CHUNK)
                    if not piece:
                        break
                    upstream.sendall(piece)
                while True:
                    piece = upstream.recv(CHUNK)
                    if not piece:
                        break
                    client.sendall(piece)
    except RequestError as error:
        try:
            client.sendall(error_answer(error))
        except OSError:
            pass
    except OSError:
        pass  # the client (HAProxy) went away: nothing to answer


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        settings = self.server.settings
        handle(self.request, settings["routed_socket"], settings["spool_dir"], settings["max_body_bytes"])


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # HAProxy opens up to gateway_model_finder_max_requests connections at once (socketserver's default is 5).
    request_queue_size = 256


def serve(listen: str, settings: dict) -> None:
    """Listen on the Unix socket LISTEN (0600: this service's user, which is HAProxy's) until stopped."""
    if os.path.exists(listen):
        os.unlink(listen)
    server = _Server(listen, _Handler)
    server.settings = settings
    os.chmod(listen, 0o600)
    server.serve_forever()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the service's settings (JSON)")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as handle_:
        settings = json.load(handle_)
    if os.getuid() == 0 and "user_id" in settings:
        # Started as root: HAProxy's user from here on (systemd's User= would need a passwd entry, which HAProxy's
        # uid in its image, 99, has on few hosts).
        os.setgroups([])
        os.setgid(int(settings["group_id"]))
        os.setuid(int(settings["user_id"]))
    os.makedirs(settings["spool_dir"], mode=0o700, exist_ok=True)
    serve(settings["listen"], settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
