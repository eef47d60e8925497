import json

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import GateConfig, Response, run_gate

MODELS = Response(200, json.dumps({"object": "list", "data": [{"id": "qwen3-lab", "object": "model"}]}))
COMPLETION = Response(200, json.dumps({"choices": [{"message": {"role": "assistant", "content": "OK"}}],
                                       "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}))
METRICS = Response(200, "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n"
                        'vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-lab"} 0.0\n')
HEALTHY = {"Running": True, "Status": "running", "Health": {"Status": "healthy"}}


class ScriptedServer:
    """Answers each path from a list, repeating the last answer; an exception in the list is raised."""

    def __init__(self, **answers):
        self.answers = {path: list(seq) for path, seq in answers.items()}
        self.calls = []

    def __call__(self, method, path, body):
        self.calls.append((method, path, body))
        seq = self.answers[path]
        answer = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def server(**overrides):
    answers = {"/health": [Response(200, "")], "/v1/models": [MODELS], "/v1/chat/completions": [COMPLETION],
               "/metrics": [METRICS]}
    answers.update(overrides)
    return ScriptedServer(**answers)


@pytest.fixture
def gate(fake_clock):
    def run(srv, state=lambda: HEALTHY, timeout=60, **config):
        return run_gate(GateConfig(served_model_name="qwen3-lab", api_key="k", timeout=timeout, **config), srv, state,
                        clock=fake_clock, sleep=fake_clock.sleep)
    return run


def test_a_serving_server_passes_every_step_in_order(gate):
    srv = server()
    result = gate(srv)
    assert result.passed, result.message
    assert list(result.step_seconds) == ["container", "health", "models", "completion", "metrics", "healthcheck"]
    assert [path for _m, path, _b in srv.calls] == ["/health", "/v1/models", "/v1/chat/completions", "/metrics"]
    method, _path, body = srv.calls[2]
    assert method == "POST" and body["max_tokens"] == 1 and body["model"] == "qwen3-lab"
    assert result.completion["usage"]["completion_tokens"] == 1


def test_gate_waits_while_the_model_loads(gate):
    srv = server(**{"/health": [ConnectionRefusedError("refused"), Response(503, ""), Response(200, "")]})
    result = gate(srv, poll_interval=5)
    assert result.passed
    assert result.step_seconds["health"] == 10


def test_health_passing_is_not_enough_the_completion_must_work(gate):
    result = gate(server(**{"/v1/chat/completions": [Response(500, '{"error": "engine dead"}')]}), timeout=30)
    assert not result.passed
    assert result.failed_step == "completion"
    assert "not ready after 30 s" in result.message
    assert "engine dead" in result.last_response


def test_wrong_api_key_fails_at_once_with_the_reason(gate):
    result = gate(server(**{"/v1/chat/completions": [Response(401, '{"error": "Unauthorized"}')]}))
    assert result.failed_step == "completion"
    assert "API key does not match" in result.message


def test_wrong_served_name_fails_at_once(gate):
    other = Response(200, json.dumps({"data": [{"id": "other-model"}]}))
    result = gate(server(**{"/v1/models": [other]}))
    assert result.failed_step == "models"
    assert "'qwen3-lab' is not among ['other-model']" in result.message


def test_missing_metric_fails_at_the_metrics_step(gate):
    result = gate(server(**{"/metrics": [Response(200, "vllm:num_requests_running 0\n")]}), timeout=10)
    assert result.failed_step == "metrics"
    assert "lacks vllm:kv_cache_usage_perc" in result.message


STARTING = HEALTHY | {"Health": {"Status": "starting"}}


def test_a_container_that_exits_while_loading_stops_the_gate_early(gate):
    states = iter([STARTING, {"Running": False, "Status": "exited", "ExitCode": 1}])
    result = gate(server(**{"/health": [ConnectionRefusedError("refused")]}), state=lambda: next(states), timeout=900)
    assert result.failed_step == "health"
    assert "exit code 1" in result.message


def test_a_server_that_answers_does_not_wait_for_dockers_next_health_check(fake_clock):
    # Docker before Engine 25 runs the check only every interval: the container's own check command, run once, says
    # what Docker will find.
    runs = []
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900), server(), lambda: STARTING,
                      clock=fake_clock, sleep=fake_clock.sleep, run_healthcheck=lambda: runs.append(1) or (0, ""))
    assert result.passed, result.message
    assert runs == [1] and fake_clock.now == 0


def test_a_health_check_command_that_fails_is_retried_then_fails_the_gate(fake_clock):
    answers = iter([(1, "curl: (7) refused"), (0, "")])
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900, poll_interval=2), server(),
                      lambda: STARTING, clock=fake_clock, sleep=fake_clock.sleep, run_healthcheck=lambda: next(answers))
    assert result.passed and result.step_seconds["healthcheck"] == 2
    broken = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=30), server(), lambda: STARTING,
                      clock=fake_clock, sleep=fake_clock.sleep, run_healthcheck=lambda: (2, "No such file: server.crt"))
    assert broken.failed_step == "healthcheck"
    assert "not ready after 30 s: the container's health check exited 2: No such file: server.crt" in broken.message


def test_without_a_way_to_run_the_check_the_gate_waits_for_docker(fake_clock):
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900, poll_interval=2), server(),
                      lambda: HEALTHY if fake_clock.now >= 4 else STARTING, clock=fake_clock, sleep=fake_clock.sleep)
    assert result.passed and result.step_seconds["healthcheck"] == 4


def test_an_unhealthy_container_fails_the_gate_even_when_it_answers(gate):
    unhealthy = HEALTHY | {"Health": {"Status": "unhealthy"}}
    result = gate(server(), state=lambda: unhealthy)
    assert result.failed_step == "container" and "unhealthy" in result.message


def test_an_unhealthy_container_whose_check_fails_again_now_fails_the_gate_at_once(fake_clock):
    unhealthy = HEALTHY | {"Health": {"Status": "unhealthy"}}
    runs = []
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900), server(), lambda: unhealthy,
                      clock=fake_clock, sleep=fake_clock.sleep,
                      run_healthcheck=lambda: runs.append(1) or (1, "HTTP 503 draining"))
    assert result.failed_step == "container" and fake_clock.now == 0 and runs == [1]
    assert "unhealthy and its health check, run again now, exited 1: HTTP 503 draining" in result.message


def test_a_stale_unhealthy_verdict_does_not_fail_a_server_that_answers_now(fake_clock):
    # A GPU fault flag failed /health long enough for Docker's three checks; the return set the flag aside, and Docker
    # says "unhealthy" until its next check, up to an interval later: the check run now passes, and so does the gate.
    unhealthy = HEALTHY | {"Health": {"Status": "unhealthy"}}
    runs = []
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900), server(), lambda: unhealthy,
                      clock=fake_clock, sleep=fake_clock.sleep, run_healthcheck=lambda: runs.append(1) or (0, ""))
    assert result.passed, result.message
    assert len(runs) == 2 and fake_clock.now == 0  # once for the first step, once for the last, each confirming


def test_a_missing_container_fails_the_first_step(gate):
    result = gate(server(), state=lambda: None)
    assert result.failed_step == "container" and "does not exist" in result.message


def test_container_dying_during_http_polling_is_reported_without_waiting_out_the_timeout(fake_clock):
    states = iter([HEALTHY, {"Running": False, "Status": "exited", "ExitCode": 137, "OOMKilled": True}])
    srv = server(**{"/health": [ConnectionRefusedError("refused")]})
    clock = fake_clock
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900), srv, lambda: next(states),
                      clock=clock, sleep=clock.sleep)
    assert result.failed_step == "health"
    assert "OOM-killed" in result.message
    assert clock.now < 900


def test_a_restart_since_the_gate_began_fails_it_without_waiting_for_the_backoff(fake_clock):
    # Seen in the lab: a restart policy brings vLLM back at once, so between crashes the container reads "running"
    # (health "starting") and "restarting" only in the growing backoff.
    states = iter([dict(STARTING, RestartCount=0), dict(STARTING, RestartCount=0),
                   dict(STARTING, RestartCount=1, ExitCode=1)])
    clock = fake_clock
    result = run_gate(GateConfig(served_model_name="qwen3-lab", timeout=900),
                      server(**{"/health": [ConnectionRefusedError("refused")]}), lambda: next(states),
                      clock=clock, sleep=clock.sleep)
    assert result.failed_step == "health"
    assert "restarted it 1 time(s) during the gate: vLLM exits at startup" in result.message
    assert clock.now < 900


def test_restarts_before_the_gate_do_not_fail_a_healthy_server(gate):
    # An unchanged server that Docker restarted once, days ago, serves: the count only matters if it grows.
    result = gate(server(), state=lambda: dict(HEALTHY, RestartCount=3))
    assert result.passed


def test_a_crash_looping_container_is_reported_as_such(gate):
    looping = {"Running": True, "Restarting": True, "Status": "restarting", "ExitCode": 1}
    result = gate(server(), state=lambda: looping)
    assert result.failed_step == "container"
    assert "restart loop (last exit code 1)" in result.message


def embedding(vector):
    return Response(200, json.dumps({"object": "list", "data": [{"index": 0, "embedding": vector}],
                                     "usage": {"prompt_tokens": 3, "total_tokens": 3}}))


def test_a_pooling_server_is_proved_by_one_embedding(gate):
    srv = server(**{"/v1/embeddings": [embedding([0.1, -0.2, 0.3])]})
    result = gate(srv, runner="pooling")
    assert result.passed, result.message
    assert [path for _m, path, _b in srv.calls] == ["/health", "/v1/models", "/v1/embeddings", "/metrics"]
    assert srv.calls[2][2] == {"model": "qwen3-lab", "input": "Say OK."}
    assert result.completion["dimensions"] == 3


def test_an_embedding_of_nan_fails_the_pooling_gate_at_once(gate):
    srv = server(**{"/v1/embeddings": [Response(200, '{"data": [{"embedding": [0.1, NaN]}]}')]})
    result = gate(srv, runner="pooling")
    assert not result.passed and result.failed_step == "completion"
    assert "NaN or infinite" in result.message
