# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bearer-key middleware the vllm_server role mounts into the container, driven as ASGI (no server needed)."""
from __future__ import annotations

import asyncio
import importlib.util
import os

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC = importlib.util.spec_from_file_location(
    "onprem_vllm_auth", os.path.join(ROOT, "roles", "vllm_server", "files", "onprem_vllm_auth.py"))
auth = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(auth)

KEY = "lab-key-0123456789abcdef"


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


def call(middleware, path, method="POST", authorization=None, kind="http", root_path=""):
    headers = [(b"host", b"x")] + ([(b"authorization", authorization.encode())] if authorization is not None else [])
    scope = {"type": kind, "method": method, "path": path, "root_path": root_path, "headers": headers}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent


@pytest.fixture()
def middleware(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    return auth.BearerKeyMiddleware(_inner, key_file=str(key_file))


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/detokenize", "/pooling", "/classify", "/score",
                                  "/rerank", "/v1/completions", "/v1/chat/completions", "/v1/models",
                                  "/collective_rpc", "/sleep", "/health/", "/metrics/../v1/completions", "/"])
@pytest.mark.parametrize("authorization", [None, "", "Bearer ", "Bearer wrong-key", "Basic " + KEY, KEY,
                                           "Bearer " + KEY + "x", "Bearer  " + KEY])
def test_every_other_path_needs_the_key(middleware, path, authorization):
    sent = call(middleware, path, authorization=authorization)
    assert sent[0]["status"] == 401
    assert KEY.encode() not in sent[1]["body"]


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/pooling", "/v1/completions"])
def test_the_right_key_is_served(middleware, path):
    assert call(middleware, path, authorization="Bearer " + KEY)[0]["status"] == 200
    assert call(middleware, path, authorization="bearer " + KEY)[0]["status"] == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics", "/metrics/"])
def test_probes_are_open_for_get_only(middleware, path):
    assert call(middleware, path, method="GET")[0]["status"] == 200
    assert call(middleware, path, method="POST")[0]["status"] == 401  # POST /ping is SageMaker's invocation alias


def test_root_path_is_stripped(middleware):
    assert call(middleware, "/api/health", method="GET", root_path="/api")[0]["status"] == 200
    assert call(middleware, "/api/tokenize", root_path="/api")[0]["status"] == 401


def test_cors_preflight_passes(middleware):
    assert call(middleware, "/v1/completions", method="OPTIONS")[0]["status"] == 200


def test_websocket_without_key_is_closed(middleware):
    assert call(middleware, "/v1/realtime", method="GET", kind="websocket") == [{"type": "websocket.close",
                                                                                "code": 1008}]


def test_lifespan_passes(middleware):
    assert call(middleware, "", kind="lifespan")[0]["status"] == 200


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_key_file_stops_the_server(tmp_path, content):
    key_file = tmp_path / "key"
    key_file.write_text(content)
    with pytest.raises(RuntimeError, match="empty"):
        auth.BearerKeyMiddleware(_inner, key_file=str(key_file))


def test_a_missing_key_file_stops_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.KEY_FILE_ENV, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):
        auth.BearerKeyMiddleware(_inner)


def test_health_fails_while_the_host_drains_and_everything_else_serves(tmp_path):
    """The drain flag (written when the host shuts down) fails /health only: the gateways stop sending new requests,
    the requests the server has (and any that still arrive) are served."""
    key_file, flag = tmp_path / "key", tmp_path / "draining"
    key_file.write_text(KEY + "\n")
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file), drain_file=str(flag))
    assert call(guard, "/health", method="GET")[0]["status"] == 200
    flag.touch()
    sent = call(guard, "/health", method="GET")
    assert sent[0]["status"] == 503 and b"draining" in sent[1]["body"]
    assert call(guard, "/v1/completions", authorization="Bearer " + KEY)[0]["status"] == 200
    assert call(guard, "/metrics", method="GET")[0]["status"] == 200
    flag.unlink()
    assert call(guard, "/health", method="GET")[0]["status"] == 200


def test_during_a_rotation_both_keys_are_served_and_no_other(tmp_path):
    """The key file holds the current key and the rotation's other one, one per line: both pass, anything else not."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\nnext-key-fedcba9876543210\n")
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file))
    for key in (KEY, "next-key-fedcba9876543210"):
        assert call(guard, "/v1/models", "GET", "Bearer " + key)[0]["status"] == 200
    for wrong in ("Bearer " + KEY + "\nnext-key-fedcba9876543210", "Bearer next-key", "Bearer "):
        assert call(guard, "/v1/models", "GET", wrong)[0]["status"] == 401
