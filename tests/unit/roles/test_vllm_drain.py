# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain-on-shutdown script (roles/vllm_server/files/onprem_vllm_drain.py, onprem-vllm-drain.service's ExecStop):
it writes the flag that fails /health, then waits at least min_wait and until no request runs or waits, at most
timeout. Driven with a fake clock and fake /metrics reads, then once against a real HTTP server."""
from __future__ import annotations

import http.server
import importlib.util
import os
import threading

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC = importlib.util.spec_from_file_location(
    "onprem_vllm_drain", os.path.join(ROOT, "roles", "vllm_server", "files", "onprem_vllm_drain.py"))
drain = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(drain)

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-30b-a3b"} %s
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3-30b-a3b"} %s
vllm:num_requests_running_total 99.0
"""


def test_in_flight_counts_running_and_waiting_only():
    assert drain.in_flight(METRICS % ("2.0", "1.0")) == 3
    assert drain.in_flight(METRICS % ("0.0", "0.0")) == 0
    assert drain.in_flight("") == 0


def test_it_waits_the_minimum_then_for_the_requests_in_flight(tmp_path, fake_clock):
    clock, reads = fake_clock, iter([3, 3, 2, 1] + [0] * 100)
    flag = tmp_path / "run" / "draining"
    waited, counts = drain.drain(str(flag), ["http://x/metrics"], min_wait=1.0, timeout=60, poll=0.5,
                                 clock=clock, sleep=clock.sleep, read=lambda url: next(reads))
    assert flag.read_text() == "draining\n"
    assert waited == 2.0 and counts == [0]  # 3, 3, 2, 1 in flight: four polls of 0.5 s, past the 1 s minimum


def test_an_idle_or_stopped_server_still_waits_the_minimum(tmp_path, fake_clock):
    clock = fake_clock
    waited, counts = drain.drain(str(tmp_path / "draining"), ["http://x/metrics"], min_wait=5.0, timeout=60,
                                 poll=0.5, clock=clock, sleep=clock.sleep, read=lambda url: None)
    assert waited == 5.0 and counts == [None]


def test_it_gives_up_at_the_timeout(tmp_path, fake_clock):
    clock = fake_clock
    waited, counts = drain.drain(str(tmp_path / "draining"), ["http://x/metrics"], min_wait=1.0, timeout=3.0,
                                 poll=0.5, clock=clock, sleep=clock.sleep, read=lambda url: 1)
    assert waited == 3.0 and counts == [1]


def test_the_command_reads_a_real_metrics_endpoint(tmp_path):
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (METRICS % ("0.0", "0.0")).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/metrics" % server.server_port
        assert drain.read_in_flight(url) == 0
        flag = tmp_path / "draining"
        assert drain.main(["--flag", str(flag), "--metrics", url, "--min-wait", "0", "--timeout", "5"]) == 0
        assert flag.exists()
    finally:
        server.shutdown()
        server.server_close()
    assert drain.read_in_flight(url) is None  # nothing answers: nothing to wait for
