#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_health_gate
short_description: Wait until a vLLM server really serves, step by step
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Runs on the vLLM host and passes only when, in order, the container is running, C(/health) answers 200,
    C(/v1/models) lists the served model name, a one-token chat completion with the API key succeeds,
    C(/metrics) exposes the required vLLM series, and the container's own health check passes (Docker's C(healthy),
    or, while Docker still says C(starting), one run of its check command; Docker before Engine 25 runs it only every
    interval).
  - C(/health) alone can pass before the model is servable, which is why the gate insists on a real completion.
  - On failure the message names the step, the last response and the container's last log lines.
extends_documentation_fragment:
  - onprem.vllm.vllm_server
options:
  served_model_name:
    description: The name C(/v1/models) must list and the completion uses.
    type: str
    required: true
  runner:
    description:
      - What the server runs. C(generate) proves it with a one-token chat completion, C(pooling) (embedding and
        rerank models) with one embedding of finite numbers from C(/v1/embeddings).
    type: str
    choices: [generate, pooling]
    default: generate
  container_name:
    description:
      - Docker container to watch; a container that stops or restarts fails the gate at once, and so does one Docker
        calls unhealthy whose health check, run again then, fails too (a stale verdict, e.g. from a drain, does not).
    type: str
  docker_path:
    description: The docker CLI on the host.
    type: str
    default: docker
  timeout:
    description: Seconds the whole gate may take; loading a 30B FP8 model takes minutes, hence the default.
    type: int
    default: 900
  request_timeout:
    description: Seconds one HTTP request may take.
    type: int
    default: 60
  poll_interval:
    description: Seconds between two tries of a step that is not ready yet.
    type: float
    default: 2.0
  required_metrics:
    description: Metric names C(/metrics) must expose.
    type: list
    elements: str
    default: [vllm:kv_cache_usage_perc]
  log_lines:
    description: How many of the container's last log lines a failure message carries.
    type: int
    default: 40
attributes:
  check_mode:
    support: full
    description: The gate only reads; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

EXAMPLES = r"""
- name: Gate the freshly started server
  onprem.vllm.vllm_health_gate:
    url: http://127.0.0.1:8000
    served_model_name: qwen3-30b-a3b
    api_key: "{{ onprem_vllm_api_key }}"
    container_name: vllm
    timeout: 900
"""

RETURN = r"""
passed:
  description: Whether every step passed.
  type: bool
  returned: always
failed_step:
  description: The step that failed (container, health, models, completion, metrics); empty when passed.
  type: str
  returned: always
step_seconds:
  description: Seconds each passed step took, in order; their sum is the gate's wall time.
  type: dict
  returned: always
total_seconds:
  description: Wall time of the gate.
  type: float
  returned: always
completion:
  description: The one-token completion (text and usage), or on a pooling server the embedding's dimensions and usage,
    that proved the server serves.
  type: dict
  returned: when passed
last_response:
  description: The last HTTP answer the gate saw, shortened.
  type: str
  returned: always
container_log_tail:
  description: The container's last log lines, on failure.
  type: str
  returned: on failure with container_name
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_http
from ansible_collections.onprem.vllm.plugins.module_utils.docker_api import healthcheck_argv
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import GateConfig, run_gate


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vllm_http.SERVER_ARGUMENT_SPEC,
            served_model_name=dict(type="str", required=True),
            runner=dict(type="str", default="generate", choices=["generate", "pooling"]),
            container_name=dict(type="str"),
            docker_path=dict(type="str", default="docker"),
            timeout=dict(type="int", default=900),
            request_timeout=dict(type="int", default=60),
            poll_interval=dict(type="float", default=2.0),
            required_metrics=dict(type="list", elements="str", default=["vllm:kv_cache_usage_perc"]),
            log_lines=dict(type="int", default=40),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problem = vllm_http.tls_problem(params) or vllm_http.tls_files_problem(params)
    if problem:
        module.fail_json(msg=problem)
    http = vllm_http.Server(params, timeout=params["request_timeout"]).request

    container_state = run_healthcheck = None
    docker = None
    if params["container_name"]:
        docker = module.get_bin_path(params["docker_path"], required=True)

        def container_state():
            rc, out, _err = module.run_command([docker, "inspect", "--format",
                                                '{"RestartCount": {{.RestartCount}}, "State": {{json .State}}}',
                                                params["container_name"]])
            if rc != 0:
                return None
            inspected = json.loads(out)
            return dict(inspected["State"], RestartCount=inspected["RestartCount"])

        def run_healthcheck():
            rc, out, err = module.run_command([docker, "inspect", "--format", "{{json .Config.Healthcheck}}",
                                               params["container_name"]])
            argv = healthcheck_argv((json.loads(out) or {}).get("Test")) if rc == 0 else None
            if argv is None:
                return (0, "") if rc == 0 else (rc, err)
            rc, out, err = module.run_command([docker, "exec", params["container_name"]] + argv)
            return rc, out + err

    config = GateConfig(served_model_name=params["served_model_name"], api_key=params["api_key"],
                        runner=params["runner"],
                        timeout=params["timeout"], poll_interval=params["poll_interval"],
                        required_metrics=tuple(params["required_metrics"]))
    started = time.monotonic()
    result = run_gate(config, http, container_state, run_healthcheck=run_healthcheck)
    facts = dict(changed=False, passed=result.passed, failed_step=result.failed_step,
                 step_seconds=result.step_seconds, total_seconds=round(time.monotonic() - started, 3),
                 last_response=result.last_response)
    if result.passed:
        module.exit_json(completion=result.completion, **facts)
    msg = f"health gate failed at step '{result.failed_step}': {result.message}"
    if result.last_response:
        msg += f"; last response: {result.last_response}"
    if docker:
        _rc, out, err = module.run_command([docker, "logs", "--tail", str(params["log_lines"]),
                                            params["container_name"]])
        facts["container_log_tail"] = (out + err).strip()
        msg += f"; last {params['log_lines']} lines of `docker logs {params['container_name']}`:\n{facts['container_log_tail']}"
    module.fail_json(msg=msg, **facts)


if __name__ == "__main__":
    main()
