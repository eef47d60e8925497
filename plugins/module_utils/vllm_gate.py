# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM health gate, step by step: container running → /health → /v1/models → one-token completion (one embedding
on a pooling server) → /metrics → the container's own health check passes.

`/health` can pass before the model is servable, so the gate only trusts a real completion. Docker's health status is
not waited for: before Engine 25 (no start_interval) Docker runs the check only every interval, so a ready server
waited up to a whole interval (15 s by default) for its next run. Once the HTTP steps pass, a container Docker still
calls "starting" has its own check command run once (injected: run_healthcheck), which proves Docker will find it
healthy. "unhealthy" fails the gate at any step once the check, run again then, fails too: Docker's verdict is the last
three checks, up to three intervals old, and a server that was refused on purpose (a GPU fault flag or a drain, which
fail /health) is still "unhealthy" for up to an interval after the flag is set aside for its return. Pure logic: HTTP
and the container probes are injected, so the same code runs in the module, in tests and from a benchmark.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable

REQUIRED_METRIC = "vllm:kv_cache_usage_perc"
STEPS = ("container", "health", "models", "completion", "metrics", "healthcheck")


@dataclass
class Response:
    status: int
    body: str


@dataclass
class GateConfig:
    served_model_name: str
    api_key: str = ""
    timeout: float = 900.0
    poll_interval: float = 2.0
    required_metrics: tuple = (REQUIRED_METRIC,)
    prompt: str = "Say OK."
    # generate: a one-token chat completion; pooling (embedding/rerank servers): one embedding.
    runner: str = "generate"


@dataclass
class GateResult:
    passed: bool
    failed_step: str = ""
    message: str = ""
    last_response: str = ""
    step_seconds: dict = field(default_factory=dict)
    completion: dict = field(default_factory=dict)


class StepNotReady(Exception):
    """The step has not passed yet; the text says what was seen."""


class StepBroken(Exception):
    """The step can never pass (e.g. the container exited): stop polling."""


def _short(text: str, limit: int = 400) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "…"


def check_container(state: dict | None, restarts_at_start: int | None = None,
                    run_healthcheck: Callable[[], tuple[int, str]] | None = None) -> None:
    """state: `docker inspect` .State (plus the container's RestartCount), or None when the container does not exist.

    restarts_at_start: RestartCount when the gate began. A restart policy brings a crashed vLLM straight back, so the
    container reads "running" most of the time and "restarting" only in the backoff between attempts: one restart
    since the gate began already says vLLM exits at startup (waiting to catch "restarting" took minutes).
    run_healthcheck: Docker's "unhealthy" is confirmed by one run of the check now (exit 0: a stale verdict, go on)."""
    if state is None:
        raise StepBroken("the container does not exist")
    if state.get("Restarting"):
        raise StepBroken(f"the container is in a restart loop (last exit code {state.get('ExitCode')}): vLLM exits "
                         "at startup, see its log below")
    restarts = state.get("RestartCount")
    if restarts_at_start is not None and restarts is not None and restarts > restarts_at_start:
        # No exit code here: Docker resets it when it starts the container again.
        raise StepBroken(f"the container exited and Docker restarted it {restarts - restarts_at_start} time(s) during "
                         "the gate: vLLM exits at startup, see its log below")
    if not state.get("Running"):
        raise StepBroken(f"the container is not running (status {state.get('Status')}, exit code "
                         f"{state.get('ExitCode')}{', OOM-killed' if state.get('OOMKilled') else ''})")
    if (state.get("Health") or {}).get("Status") == "unhealthy":
        code, output = run_healthcheck() if run_healthcheck is not None else (None, "")
        if code != 0:
            raise StepBroken("Docker reports the container unhealthy" + (
                f" and its health check, run again now, exited {code}: {_short(output, 200)}" if code is not None
                else ""))


def check_healthcheck(state: dict | None, run_healthcheck: Callable[[], tuple[int, str]] | None) -> None:
    """The container's own health check, once the server answers (state: check_container passed it): Docker's
    "healthy" (or no check configured) passes; while Docker still says "starting", one run of the check command that
    exits 0 passes. "unhealthy" reaches this only after check_container ran the check for it and it passed."""
    health = (state.get("Health") or {}).get("Status")
    if health in (None, "healthy", "unhealthy"):
        return
    if run_healthcheck is None:
        raise StepNotReady(f"container health is {health}")
    code, output = run_healthcheck()
    if code != 0:
        raise StepNotReady(f"the container's health check exited {code}: {_short(output, 200)}")


def check_health(resp: Response) -> None:
    if resp.status != 200:
        raise StepNotReady(f"/health answered HTTP {resp.status}")


def check_models(resp: Response, served_model_name: str) -> None:
    if resp.status != 200:
        raise StepNotReady(f"/v1/models answered HTTP {resp.status}")
    try:
        ids = [entry["id"] for entry in json.loads(resp.body)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise StepNotReady(f"/v1/models answered something that is not a model list ({exc})") from exc
    if served_model_name not in ids:
        raise StepBroken(f"served model {served_model_name!r} is not among {ids}: check vllm_server_served_model_name")


def _answered(resp: Response, what: str) -> None:
    if resp.status in (401, 403):
        raise StepBroken(f"the {what} was refused with HTTP {resp.status}: the API key does not match the server's")
    if resp.status != 200:
        raise StepNotReady(f"the {what} answered HTTP {resp.status}")


def check_completion(resp: Response) -> dict:
    _answered(resp, "completion")
    try:
        body = json.loads(resp.body)
        usage = body["usage"]
        text = body["choices"][0]["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise StepNotReady(f"the completion answer is not a chat completion ({exc})") from exc
    if usage.get("completion_tokens", 0) < 1:
        raise StepNotReady("the completion produced no token")
    return {"text": text, "usage": usage}


def check_embedding(resp: Response) -> dict:
    """A pooling server's proof of serving: one embedding of finite numbers."""
    _answered(resp, "embedding")
    try:
        body = json.loads(resp.body)
        vector = body["data"][0]["embedding"]
        usage = body.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise StepNotReady(f"the answer is not an embedding ({exc})") from exc
    if not isinstance(vector, list) or not vector:
        raise StepNotReady("the embedding is empty")
    if any(not isinstance(x, (int, float)) or not math.isfinite(x) for x in vector):
        raise StepBroken("the embedding holds NaN or infinite values: the server runs but computes garbage")
    return {"dimensions": len(vector), "usage": usage}


def check_metrics(resp: Response, required: tuple) -> None:
    if resp.status != 200:
        raise StepNotReady(f"/metrics answered HTTP {resp.status}")
    names = {line.split("{")[0].split(" ")[0] for line in resp.body.splitlines() if line and not line.startswith("#")}
    missing = [name for name in required if name not in names]
    if missing:
        raise StepNotReady(f"/metrics lacks {', '.join(missing)}")


def run_gate(config: GateConfig, http: Callable[[str, str, dict | None], Response],
             container_state: Callable[[], dict | None] | None,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             run_healthcheck: Callable[[], tuple[int, str]] | None = None) -> GateResult:
    """http(method, path, json_body) → Response (raises OSError when nothing answers); run_healthcheck() runs the
    container's health check command once → (exit code, output)."""
    result = GateResult(passed=False)
    deadline = clock() + config.timeout
    pooling = config.runner == "pooling"
    if pooling:
        completion_path = "/v1/embeddings"
        completion_request = {"model": config.served_model_name, "input": config.prompt}
    else:
        completion_path = "/v1/chat/completions"
        completion_request = {"model": config.served_model_name, "max_tokens": 1, "temperature": 0,
                              "messages": [{"role": "user", "content": config.prompt}]}
    restarts_at_start: list = []  # the first RestartCount seen

    def container_checked() -> dict | None:
        state = container_state()
        if state is not None and not restarts_at_start:
            restarts_at_start.append(state.get("RestartCount"))
        check_container(state, restarts_at_start[0] if restarts_at_start else None, run_healthcheck)
        return state

    def probe(step: str) -> None:
        if step == "container":
            if container_state is not None:
                container_checked()
            return
        if step == "healthcheck":
            if container_state is not None:
                check_healthcheck(container_checked(), run_healthcheck)
            return
        if step == "health":
            resp = http("GET", "/health", None)
        elif step == "models":
            resp = http("GET", "/v1/models", None)
        elif step == "completion":
            resp = http("POST", completion_path, completion_request)
        else:
            resp = http("GET", "/metrics", None)
        result.last_response = f"HTTP {resp.status} {_short(resp.body)}"
        if step == "health":
            check_health(resp)
        elif step == "models":
            check_models(resp, config.served_model_name)
        elif step == "completion":
            result.completion = check_embedding(resp) if pooling else check_completion(resp)
        else:
            check_metrics(resp, tuple(config.required_metrics))

    for step in STEPS:
        started = clock()
        while True:
            try:
                probe(step)
                break
            except StepBroken as exc:
                return _failed(result, step, str(exc))
            except (StepNotReady, OSError) as exc:
                if isinstance(exc, OSError):
                    result.last_response = f"no answer ({exc})"
                if clock() >= deadline:
                    return _failed(result, step, f"not ready after {config.timeout:.0f} s: {exc}")
                if container_state is not None and step != "container":
                    try:  # a container that died while we poll HTTP will never answer: say so now
                        container_checked()
                    except StepBroken as dead:
                        return _failed(result, step, str(dead))
                    except StepNotReady:
                        pass
                sleep(config.poll_interval)
        result.step_seconds[step] = round(clock() - started, 3)
    result.passed = True
    return result


def _failed(result: GateResult, step: str, message: str) -> GateResult:
    result.failed_step = step
    result.message = message
    return result
