# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bearer-key middleware the vllm_server role mounts into the container, driven as ASGI (no server needed)."""
from __future__ import annotations

import importlib.util
import json
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


@pytest.fixture()
def call(asgi_call):
    def request(middleware, path, method="POST", authorization=None, kind="http", root_path="", headers=()):
        authorization = [("authorization", authorization)] if authorization is not None else []
        return asgi_call(middleware, path, method, [*authorization, *headers], kind, root_path)
    return request


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
def test_every_other_path_needs_the_key(middleware, path, authorization, call):
    sent = call(middleware, path, authorization=authorization)
    assert sent[0]["status"] == 401
    assert KEY.encode() not in sent[1]["body"]


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/pooling", "/v1/completions"])
def test_the_right_key_is_served(middleware, path, call):
    assert call(middleware, path, authorization="Bearer " + KEY)[0]["status"] == 200
    assert call(middleware, path, authorization="bearer " + KEY)[0]["status"] == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics", "/metrics/"])
def test_probes_are_open_for_get_only(middleware, path, call):
    assert call(middleware, path, method="GET")[0]["status"] == 200
    assert call(middleware, path, method="POST")[0]["status"] == 401  # POST /ping is SageMaker's invocation alias


def test_root_path_is_stripped(middleware, call):
    assert call(middleware, "/api/health", method="GET", root_path="/api")[0]["status"] == 200
    assert call(middleware, "/api/tokenize", root_path="/api")[0]["status"] == 401


def test_cors_preflight_passes(middleware, call):
    assert call(middleware, "/v1/completions", method="OPTIONS")[0]["status"] == 200


def test_websocket_without_key_is_closed(middleware, call):
    assert call(middleware, "/v1/realtime", method="GET", kind="websocket") == [{"type": "websocket.close",
                                                                                "code": 1008}]


def test_lifespan_passes(middleware, call):
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


def test_health_fails_while_the_host_drains_and_everything_else_serves(tmp_path, call):
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


def _replace(path, text):
    """What host_files does: a new file renamed over the old one (the server sees a new inode)."""
    tmp = path.with_name(".key.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_rotation_takes_effect_without_a_restart(tmp_path, call, capsys):
    """Each step of docs/key_rotation.md rewrites the key file; the running guard follows it. A file that cannot be read
    later (gone, empty) keeps the keys read before instead of locking everyone out, and says so once."""
    key_dir = tmp_path / "secrets"
    key_dir.mkdir()
    key_file = key_dir / "api-key"
    key_file.write_text(KEY + "\n")
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file))
    nxt = "next-key-fedcba9876543210"
    assert call(guard, "/v1/models", "GET", "Bearer " + nxt)[0]["status"] == 401
    _replace(key_file, KEY + "\n" + nxt + "\n")  # step 1: both
    assert [call(guard, "/v1/models", "GET", "Bearer " + k)[0]["status"] for k in (KEY, nxt)] == [200, 200]
    _replace(key_file, nxt + "\n")  # step 3: the new key alone
    assert [call(guard, "/v1/models", "GET", "Bearer " + k)[0]["status"] for k in (KEY, nxt)] == [401, 200]
    _replace(key_file, "\n")
    assert [call(guard, "/v1/models", "GET", "Bearer " + nxt)[0]["status"] for attempt in (1, 2)] == [200, 200]
    key_file.unlink()
    assert [call(guard, "/v1/models", "GET", "Bearer " + nxt)[0]["status"] for attempt in (1, 2)] == [200, 200]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and "is empty" in said[0] and "No such file" in said[1], said
    _replace(key_file, KEY + "\n")
    assert [call(guard, "/v1/models", "GET", "Bearer " + k)[0]["status"] for k in (KEY, nxt)] == [200, 401]


def test_a_gpu_fault_fails_health_until_the_flag_is_removed_whatever_the_shutdown_drain_does(tmp_path, call):
    """The Xid monitor's flag (on disk, outliving restarts) fails /health like the shutdown drain, says why, and shows
    in the drain status; the shutdown drain's flag going away does not put the host back."""
    key_file, drain, fault = tmp_path / "key", tmp_path / "draining", tmp_path / "gpu-fault" / "xid.json"
    key_file.write_text(KEY + "\n")
    fault.parent.mkdir()
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file), drain_file=str(drain), fault_file=str(fault))
    assert call(guard, "/health", method="GET")[0]["status"] == 200
    fault.write_text('{"events": [{"code": 79}]}')
    sent = call(guard, "/health", method="GET", authorization="Bearer " + KEY, headers=[("x-onprem-check", "gw1;fall=2")])
    assert sent[0]["status"] == 503 and b"critical Xid" in sent[1]["body"]
    drain.touch()
    drain.unlink()
    assert call(guard, "/health", method="GET")[0]["status"] == 503
    status = json.loads(call(guard, "/onprem/drain", method="GET")[1]["body"])
    assert status["draining"] and status["gpu_fault"] and status["checks"]["gw1"]["refused"] == 1
    assert call(guard, "/v1/completions", authorization="Bearer " + KEY)[0]["status"] == 200
    fault.unlink()
    assert call(guard, "/health", method="GET")[0]["status"] == 200


def test_during_a_rotation_both_keys_are_served_and_no_other(tmp_path, call):
    """The key file holds the current key and the rotation's other one, one per line: both pass, anything else not."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\nnext-key-fedcba9876543210\n")
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file))
    for key in (KEY, "next-key-fedcba9876543210"):
        assert call(guard, "/v1/models", "GET", "Bearer " + key)[0]["status"] == 200
    for wrong in ("Bearer " + KEY + "\nnext-key-fedcba9876543210", "Bearer next-key", "Bearer "):
        assert call(guard, "/v1/models", "GET", wrong)[0]["status"] == 401


def test_the_drain_status_counts_each_gateways_refused_checks(tmp_path, call):
    """Every keyed check that names its gateway and fall is noted, before a drain too (the drain then knows which
    gateways to wait for from its first poll); while the host drains, /health refuses every check and counts the
    named ones, a malformed header is refused but not counted. Out of the drain the counts start afresh."""
    key_file, flag = tmp_path / "key", tmp_path / "draining"
    key_file.write_text(KEY + "\n")
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file), drain_file=str(flag))

    def check(value):
        return call(guard, "/health", method="GET", authorization="Bearer " + KEY,
                    headers=[("x-onprem-check", value)])[0]["status"]

    def status():
        sent = call(guard, "/onprem/drain", method="GET")
        assert sent[0]["status"] == 200
        return json.loads(sent[1]["body"])

    assert status() == {"draining": False, "gpu_fault": False, "in_flight": 0, "checks": {}}
    assert check("gw1;fall=2") == 200 and status()["checks"]["gw1"]["refused"] == 0
    flag.touch()
    assert status()["checks"]["gw1"] == {"refused": 0, "fall": 2, "idle_s": 0.0}  # known before its next check
    for value in ("gw1;fall=2", "gw1;fall=2", "gw2;fall=3", "gw 3;fall=2", "gw4", "gw5;fall=x"):
        assert check(value) == 503
    seen = status()
    assert seen["draining"] and seen["in_flight"] == 0
    counted = {name: (entry["refused"], entry["fall"]) for name, entry in seen["checks"].items()}
    assert counted == {"gw1": (2, 2), "gw2": (1, 3)}
    assert 0 <= seen["checks"]["gw1"]["idle_s"] < 5
    flag.unlink()
    assert check("gw1;fall=2") == 200
    flag.touch()
    assert {name: entry["refused"] for name, entry in status()["checks"].items()} == {"gw1": 0, "gw2": 1}


def test_the_drain_status_table_is_bounded(tmp_path):
    key_file, flag = tmp_path / "key", tmp_path / "draining"
    key_file.write_text(KEY + "\n")
    flag.touch()
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file), drain_file=str(flag))
    for number in range(auth.MAX_CHECKERS + 10):
        guard.health_check({"headers": [(b"x-onprem-check", b"gw%d;fall=2" % number)]}, keyed=True)
    assert len(guard.refused) == auth.MAX_CHECKERS


@pytest.mark.parametrize("draining", [False, True])
def test_a_check_with_a_key_the_server_lacks_is_refused_and_never_counted(tmp_path, call, draining):
    """The gateway's check carries its key: one this server does not hold fails the check (401, the server leaves
    rotation instead of refusing the gateway's requests); a check header without a key, or with a wrong one, is not
    counted, so a host on the LAN cannot end a drain early or crowd out the real gateways."""
    key_file, flag = tmp_path / "key", tmp_path / "draining"
    key_file.write_text(KEY + "\n")
    if draining:
        flag.touch()
    guard = auth.BearerKeyMiddleware(_inner, key_file=str(key_file), drain_file=str(flag))
    forged = [("x-onprem-check", "gw1;fall=0")]
    for authorization in ("Bearer wrong-key", "Bearer " + KEY + "x", "Basic " + KEY, ""):
        sent = call(guard, "/health", method="GET", authorization=authorization, headers=forged)
        assert sent[0]["status"] == 401 and KEY.encode() not in sent[1]["body"]
        assert b"key file" in sent[1]["body"]
    assert call(guard, "/health", method="GET", headers=forged)[0]["status"] == (503 if draining else 200)
    assert guard.refused == {}
    assert call(guard, "/health", method="GET", authorization="Bearer " + KEY)[0]["status"] == (503 if draining else 200)


def test_requests_in_flight_are_counted_until_answered(middleware, call):
    """A request past the guard counts until the app has sent its last chunk (a stream too); refused and open
    requests do not count."""
    seen = []

    async def app(scope, receive, send):
        seen.append(guard.in_flight)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"chunk", "more_body": True})
        seen.append(guard.in_flight)
        await send({"type": "http.response.body", "body": b""})

    guard = middleware
    guard.app = app
    call(guard, "/v1/completions", authorization="Bearer " + KEY)
    call(guard, "/v1/completions", authorization="Bearer wrong")
    call(guard, "/metrics", method="GET")
    assert seen == [1, 1, 0, 0] and guard.in_flight == 0
