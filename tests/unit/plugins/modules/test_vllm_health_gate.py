# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_health_gate module against vLLM's endpoints served over real HTTP on 127.0.0.1 (the /metrics page is
the one recorded from the lab's vLLM 0.32.0): check mode, applied, again; a wrong key, name or metric fails the
step it belongs to, and the key never shows in the result."""
from __future__ import annotations

import json

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_health_gate

STEPS = ["health", "models", "completion", "metrics"]


@pytest.fixture
def gate(call_module, vllm_endpoints):
    def run(**args):
        args = dict({"url": vllm_endpoints.url, "served_model_name": "q", "api_key": vllm_endpoints.key,
                     "timeout": 5, "poll_interval": 0.1}, **args)
        return call_module(vllm_health_gate, **args)
    return run


def test_check_apply_and_again_pass_every_step_and_change_nothing(gate, vllm_endpoints):
    runs = [gate(_ansible_check_mode=mode) for mode in (True, False, False)]
    for rc, result in runs:
        assert rc == 0 and result["passed"] is True and result["changed"] is False, result.get("msg")
        assert list(result["step_seconds"]) == ["container"] + STEPS + ["healthcheck"] and not result["failed_step"]
        assert result["completion"]["usage"]["completion_tokens"] == 1
    assert [path for _method, path, _auth in vllm_endpoints.seen] == [
        "/health", "/v1/models", "/v1/chat/completions", "/metrics"] * 3
    assert {auth for _m, _p, auth in vllm_endpoints.seen} == {"Bearer " + vllm_endpoints.key}


def test_a_wrong_key_fails_at_the_first_step_behind_the_key_and_is_not_shown(gate):
    rc, result = gate(api_key="not-the-key-42", timeout=1)
    assert rc == 1 and result["failed"] and result["failed_step"] == "models" and "HTTP 401" in result["msg"]
    assert "not-the-key-42" not in json.dumps(result)


def test_a_wrong_served_name_fails_at_the_models_step(gate):
    rc, result = gate(served_model_name="qwen3-lab")
    assert rc == 1 and result["failed_step"] == "models" and "'qwen3-lab' is not among ['q']" in result["msg"]


def test_a_metric_the_page_lacks_fails_at_the_metrics_step(gate):
    rc, result = gate(required_metrics=["vllm:kv_cache_usage_perc", "vllm:no_such_metric"], timeout=1)
    assert rc == 1 and result["failed_step"] == "metrics" and "vllm:no_such_metric" in result["msg"]


def test_nothing_listening_fails_at_the_health_step_after_the_timeout(gate):
    rc, result = gate(url="http://127.0.0.1:9", timeout=1)
    assert rc == 1 and result["failed_step"] == "health" and "health gate failed at step 'health'" in result["msg"]


def test_mutual_tls_passes_with_the_hosts_identity_and_names_a_missing_certificate(
        call_module, vllm_endpoints_tls, tmp_path):
    srv = vllm_endpoints_tls
    args = {"url": srv.url, "served_model_name": "q", "api_key": srv.key, "timeout": 5, "poll_interval": 0.1,
            "ca_path": srv.server_cert, "client_cert": srv.client[0], "client_key": srv.client[1]}
    rc, result = call_module(vllm_health_gate, **args)
    assert rc == 0 and result["passed"] is True, result.get("msg")
    assert [path for _method, path, _auth in srv.seen] == ["/health", "/v1/models", "/v1/chat/completions", "/metrics"]
    # A certificate that is not there is a setting to fix, said at once, not a server that never came up.
    rc, result = call_module(vllm_health_gate, **dict(args, ca_path=str(tmp_path / "gone.crt")))
    assert rc == 1 and "gone.crt" in result["msg"] and len(srv.seen) == 4


def fake_docker(tmp_path, health, check_exit):
    """A docker CLI stand-in: inspect answers the container's state (Docker's health HEALTH) and its health check, exec
    runs nothing and exits CHECK_EXIT; each call is logged."""
    log = tmp_path / "docker.log"
    script = tmp_path / "docker"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$1 $3" in
  'inspect {{"RestartCount": {{{{.RestartCount}}}}, "State": {{{{json .State}}}}}}')
    echo '{{"RestartCount": 0, "State": {{"Running": true, "Status": "running", "Health": {{"Status": "{health}"}}}}}}' ;;
  'inspect {{{{json .Config.Healthcheck}}}}')
    echo '{{"Test": ["CMD", "python3", "-c", "check"], "Interval": 15000000000}}' ;;
  exec*) echo 'refused' >&2; exit {check_exit} ;;
esac
""")
    script.chmod(0o755)
    return str(script), log


def test_the_containers_own_check_passes_the_gate_before_docker_ran_it(gate, tmp_path):
    docker, log = fake_docker(tmp_path, "starting", 0)
    rc, result = gate(container_name="vllm", docker_path=docker)
    assert rc == 0 and result["passed"] is True, result.get("msg")
    assert "exec vllm python3 -c check" in log.read_text()


def test_a_container_whose_own_check_fails_fails_the_gate_at_that_step(gate, tmp_path):
    docker, _log = fake_docker(tmp_path, "starting", 3)
    rc, result = gate(container_name="vllm", docker_path=docker, timeout=1)
    assert rc == 1 and result["failed_step"] == "healthcheck"
    assert "the container's health check exited 3: refused" in result["msg"]


def test_a_healthy_container_is_not_checked_again(gate, tmp_path):
    docker, log = fake_docker(tmp_path, "healthy", 3)
    rc, result = gate(container_name="vllm", docker_path=docker)
    assert rc == 0 and result["passed"] is True and "exec" not in log.read_text()
