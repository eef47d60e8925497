# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain-on-shutdown script (roles/vllm_server/files/onprem_vllm_drain.py, onprem-vllm-drain.service's ExecStop):
it writes the flag that fails /health, then waits until every gateway has had its `fall` checks refused and no request
runs, on two polls in a row, at least min_wait and at most timeout. Driven with a fake clock and fake statuses, then
against the real middleware behind a real HTTP server, with a gateway's checks."""
from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import threading
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "roles", "vllm_server", "files", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


drain = _load("onprem_vllm_drain")
auth = _load("onprem_vllm_auth")


def status(in_flight=0, **refused):
    return {"draining": True, "in_flight": in_flight,
            "checks": {name: {"refused": count, "fall": 2} for name, count in refused.items()}}


def run(tmp_path, clock, statuses, min_wait=1.0, timeout=60.0, servers=1):
    flag = tmp_path / "run" / "draining"
    feed = iter(statuses)
    waited, last = drain.drain(str(flag), ["http://x"] * servers, min_wait=min_wait, timeout=timeout, poll=0.5,
                               clock=clock, sleep=clock.sleep, read=lambda url: next(feed))
    assert flag.read_text() == "draining\n"
    return waited, last


def test_it_waits_for_each_gateways_verdict_not_a_fixed_time(tmp_path, fake_clock):
    """A slow gateway: its second refused check comes 6 s after the flag, past the 5 s minimum. The drain waits for
    it, then for one more poll with nothing in flight."""
    statuses = [status()] * 4 + [status(gw1=1)] * 8 + [status(gw1=2)] * 4 + [status(gw1=2)] * 10
    waited, last = run(tmp_path, fake_clock, statuses, min_wait=5.0)
    assert waited == 6.5 and last == [status(gw1=2)]


def test_every_gateway_and_every_request(tmp_path, fake_clock):
    statuses = ([status(in_flight=1, gw1=2, gw2=1)] * 2 + [status(in_flight=1, gw1=2, gw2=2)] * 2
                + [status(gw1=3, gw2=2)] * 10)
    waited, last = run(tmp_path, fake_clock, statuses)
    assert waited == 2.5 and last == [status(gw1=3, gw2=2)]  # out at 2.0 s, confirmed at 2.5 s


def test_no_gateway_checks_and_idle_waits_the_minimum(tmp_path, fake_clock):
    waited, last = run(tmp_path, fake_clock, [status()] * 100, min_wait=5.0)
    assert waited == 5.0 and last == [status()]


def test_a_stopped_server_or_an_older_middleware_waits_the_minimum(tmp_path, fake_clock):
    waited, last = run(tmp_path, fake_clock, [None, {}] * 100, min_wait=5.0, servers=2)
    assert waited == 5.0 and last == [None, {}]


def test_a_gateway_known_before_the_drain_is_waited_for_until_its_verdict(tmp_path, fake_clock):
    """gw1 checked the server just before the flag: it is in the table with nothing refused yet, so the drain waits
    for its fall (at 7 s here, past the minimum) instead of ending at the minimum."""
    statuses = ([status(gw1=0)] * 10 + [status(gw1=1)] * 4 + [status(gw1=2)] * 10)
    waited, last = run(tmp_path, fake_clock, statuses, min_wait=5.0)
    assert waited == 7.5 and last == [status(gw1=2)]


def test_a_status_that_times_out_is_not_drained(tmp_path, fake_clock):
    """A busy server whose status read timed out is asked again, not counted out; a stopped one (nothing listens)
    is."""
    statuses = [dict(drain.UNREADABLE)] * 12 + [status()] * 10
    waited, _last = run(tmp_path, fake_clock, statuses, min_wait=1.0)
    assert waited == 6.5
    assert drain.is_out(None, 1.0) and not drain.is_out(dict(drain.UNREADABLE), 1.0)


def test_read_status_tells_a_stopped_server_from_a_slow_one(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert drain.read_status("http://127.0.0.1:%d" % port) is None  # nothing listens: connection refused
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts, never answers
        original = drain.urllib.request.urlopen
        drain.urllib.request.urlopen = lambda url, timeout, context=None: original(url, timeout=0.5, context=context)
        try:
            assert drain.read_status("http://127.0.0.1:%d" % silent.getsockname()[1]) == drain.UNREADABLE
        finally:
            drain.urllib.request.urlopen = original


def test_it_gives_up_at_the_timeout(tmp_path, fake_clock):
    waited, last = run(tmp_path, fake_clock, [status(in_flight=1, gw1=9)] * 100, timeout=3.0)
    assert waited == 3.0 and last == [status(in_flight=1, gw1=9)]


def test_against_the_real_middleware(tmp_path, asgi_call):
    """The middleware behind a real HTTP server: a gateway's checks pass, then, once the flag exists, are refused and
    counted; the status reports them, and the command returns once two were refused."""
    key_file, flag = tmp_path / "key", tmp_path / "run" / "draining"
    key_file.write_text("lab-key-0123456789abcdef\n")

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = auth.BearerKeyMiddleware(app, key_file=str(key_file), drain_file=str(flag))

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            sent = asgi_call(guard, self.path, "GET", list(self.headers.items()))
            body = b"".join(m.get("body", b"") for m in sent[1:])
            self.send_response(sent[0]["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % server.server_port
    stop = threading.Event()

    def gateway_checks():
        while not stop.wait(0.2):
            request = urllib.request.Request(base + "/health", headers={
                "X-Onprem-Check": "gw1;fall=2", "Authorization": "Bearer lab-key-0123456789abcdef"})
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except OSError:
                pass

    checker = threading.Thread(target=gateway_checks, daemon=True)
    try:
        assert drain.read_status(base) == {"draining": False, "gpu_fault": False, "in_flight": 0, "checks": {}}
        checker.start()
        assert drain.main(["--flag", str(flag), "--server", base, "--min-wait", "0", "--timeout", "10"]) == 0
        seen = drain.read_status(base)
        assert seen["draining"] and seen["checks"]["gw1"]["fall"] == 2 and seen["checks"]["gw1"]["refused"] >= 2
        assert json.loads(urllib.request.urlopen(base + "/onprem/drain").read())["in_flight"] == 0
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert drain.read_status(base) is None  # nothing answers: nothing to wait for


def test_a_gateway_that_stopped_checking_before_its_verdict_is_not_waited_for(tmp_path, fake_clock):
    """The server was set to maintenance at that gateway after one refused check (no more checks come): once it has
    not checked for min_wait seconds it sends nothing either."""
    stalled = [{"draining": True, "in_flight": 0, "checks": {"gw1": {"refused": 1, "fall": 2, "idle_s": idle}}}
               for idle in (0.5 * i for i in range(100))]
    waited, last = run(tmp_path, fake_clock, stalled, min_wait=5.0)
    assert waited == 5.5 and last[0]["checks"]["gw1"]["idle_s"] == 5.5
