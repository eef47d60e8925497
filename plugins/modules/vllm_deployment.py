#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_deployment
short_description: Observe, decide and act on one vLLM server's deployment on its host, crash-safe
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - One call per host and deployment. It reads the host (the containers O(name) and O(name)C(-previous), the
    deployment's records and in-progress marker), asks the pure decision core (C(module_utils/deployment_engine.py))
    for the next action, does it, reads again, until the deployment is settled. Each action is idempotent, so a run
    killed anywhere is settled by the next one.
  - A replacement writes the marker, stops the running server, keeps it as O(name)C(-previous), creates the new
    container, gates it (health gate, then the known-answer gate, then the optional benchmark gate against the
    server it replaces), writes the records, removes the server set aside and the marker. A failed gate restores the
    previous server, gates it, and fails with both outcomes. The container that last passed a gate is never removed
    before its successor passed one.
  - The deployment's identity is O(deployment_id) (the container's label C(onprem.vllm.deployment)) and a digest of
    O(container) (the label C(onprem.vllm.container)); a container made before that label existed is judged by its
    id alone.
  - The Docker Engine API is reached on its unix socket; the container's environment travels in the request body,
    never in a process argument.
extends_documentation_fragment:
  - onprem.vllm.vllm_server
options:
  name:
    description: The container's name.
    type: str
    required: true
  config_dir:
    description: The folder of the deployment's records (C(module_utils/deployment_record.py)).
    type: path
    required: true
  state:
    description:
      - V(prepared) settles only what an interrupted run left and stops before anything touches a server that passed
        its gate; RV(replaces) says whether V(deployed) will replace the running server (the rollout drains it
        first).
      - V(deployed) settles, replaces or keeps, and gates.
      - V(settled) settles only what an interrupted run left (C(playbooks/rollback.yml) does, before it reads the
        records); O(deployment_id), O(record) and O(container) are then not needed.
      - V(staged) only makes the image available (O(image_archive), else a pull); in check mode it proves that it can
        (the archive exists and Docker's data root has room to load it). V(prepared) and V(deployed) stage it first.
    type: str
    choices: [staged, settled, prepared, deployed]
    default: deployed
  deployment_id:
    description: The deployment's id (a digest of O(record) and the middleware the role wrote).
    type: str
  record:
    description: The deployment record (what runs; C(playbooks/rollback.yml) restores it).
    type: dict
  container:
    description: What the container is made of.
    type: dict
    suboptions:
      image:
        description: The image reference.
        type: str
        required: true
      command:
        description: The arguments of C(vllm serve).
        type: list
        elements: str
        required: true
      env:
        description: The environment.
        type: dict
        default: {}
      bind_address:
        description: The host address the port is published on.
        type: str
        required: true
      port:
        description: The host port.
        type: int
        required: true
      container_port:
        description: The port vLLM listens on in the container (the role's, from the onprem.vllm.host_layout lookup).
        type: int
        required: true
      volumes:
        description: Binds, each C(host:container) with an optional C(:ro).
        type: list
        elements: str
        default: []
      ipc_host:
        description: Share the host's IPC namespace (else a /dev/shm of O(container.shm_size)).
        type: bool
        default: true
      shm_size:
        description: The size of /dev/shm without O(container.ipc_host).
        type: str
        default: 16g
      gpu_uuids:
        description: The GPUs by UUID (none on a CPU server).
        type: list
        elements: str
        default: []
      healthcheck:
        description: Docker's health check - test, interval, timeout, retries, start_period.
        type: dict
        required: true
      restart_policy:
        description: Docker's restart policy.
        type: str
        default: unless-stopped
      log_options:
        description: The json-file log driver's options.
        type: dict
        default: {}
      served_model_name:
        description: The name the server answers to (a label).
        type: str
        required: true
  runner:
    description: What the gates ask (V(generate) a completion, V(pooling) an embedding).
    type: str
    choices: [generate, pooling]
    default: generate
  gate:
    description: The health gate's timing (C(vllm_health_gate)'s options).
    type: dict
    default: {}
  known_answers:
    description:
      - The known-answer gate (C(vllm_known_answers)'s options model, revision, model_config, prompts, image_prompt,
        positions, max_logprob_delta, tie_margin, min_cosine), plus C(enabled), C(accept) (record a new server's answers as they
        are) and C(recheck) (gate an unchanged server on them).
    type: dict
    default: {}
  kv:
    description: The KV plan to compare with what vLLM allocated (C(predicted), C(max_difference_pct)).
    type: dict
    default: {}
  benchmark:
    description: The optional benchmark gate (C(vllm_server_gate_benchmark)); empty for none.
    type: dict
    default: {}
  image:
    description: The image O(state=staged) makes available (the other states stage O(container.image)).
    type: str
    default: ""
  image_archive:
    description:
      - A C(docker save) archive on the host that holds O(container.image) (air-gapped delivery); empty pulls the
        image instead. Loaded only where the image is missing, and only where Docker's data root has about twice the
        archive's size free (it unpacks the whole archive before applying its layers).
    type: str
    default: ""
  stop_timeout:
    description:
      - Seconds a stopping server is given before it is killed (Docker's own default; the gateway drained it first, so
        it has no requests left to finish).
    type: int
    default: 10
  docker_timeout:
    description: Seconds a Docker API call may take.
    type: int
    default: 600
  log_lines:
    description: Lines of the server's log a failed gate reports.
    type: int
    default: 40
  host_name:
    description: The host's name in messages (its inventory name).
    type: str
    default: ""
  endpoint:
    description: Where clients reach the server (its published URL), returned as RV(endpoint) with what it runs.
    type: str
    default: ""
  fault_after:
    description:
      - Test-only fault injection (the fleet scenario's crash checks K1-K5) - the module kills itself (SIGKILL) right
        after the first action of this name, leaving the host as a dying run would. Empty (the default) never.
    type: str
    default: ""
attributes:
  check_mode:
    description: Reads the host and reports the first action and RV(replaces) without acting.
    support: full
  diff_mode:
    description: The record before and after a replacement.
    support: full
"""

EXAMPLES = r"""
- name: Settle an interrupted run and say whether the server will be replaced
  onprem.vllm.vllm_deployment:
    name: vllm
    config_dir: /etc/onprem-vllm
    state: prepared
    deployment_id: "{{ id }}"
    record: "{{ record }}"
    container: "{{ container }}"
  register: prepared

- name: Deploy and gate it (a failed gate restores the previous server)
  onprem.vllm.vllm_deployment:
    name: vllm
    config_dir: /etc/onprem-vllm
    deployment_id: "{{ id }}"
    record: "{{ record }}"
    container: "{{ container }}"
    api_key: "{{ vault_vllm_api_key }}"
"""

RETURN = r"""
state:
  description: The O(state) the call was made with.
  returned: always
  type: str
image:
  description: The image the server runs (O(container.image), else O(image)).
  returned: always
  type: str
served_model_name:
  description: The name the server answers to (O(container.served_model_name)); empty with O(state=settled).
  returned: always
  type: str
local_url:
  description: Where the host's own checks reach the server (O(url)).
  returned: always
  type: str
local_tls:
  description:
    - What the host's own checks present to reach it over mutual TLS (O(ca_path), O(client_cert), O(client_key)); empty
      strings for plain http.
  returned: always
  type: dict
endpoint:
  description: O(endpoint), as given.
  returned: always
  type: str
replaces:
  description: Whether the running server is (or, with O(state=prepared), will be) replaced.
  returned: always
  type: bool
actions:
  description: The actions taken, in order, each with why.
  returned: always
  type: list
  elements: dict
gate:
  description: The desired server's health gate (passed, failed_step, step_seconds, total_seconds).
  returned: when it ran
  type: dict
known_answers:
  description: >-
    The known-answer gate's outcome, seconds, failures and note (why answers were recorded instead of compared,
    C(vllm_known_answers)'s C(note); empty when they were compared).
  returned: when it ran
  type: dict
kv_check:
  description: The KV cache vLLM allocated against the plan (what the record keeps as kv_cache).
  returned: when the desired server passed its gate
  type: dict
rolled_back:
  description: Whether the server that ran before the failed deployment was restored.
  returned: always
  type: bool
image_pending:
  description:
    - With O(state=staged), the image that was missing (C(image)) and the archive it is loaded from (C(archive), empty
      for a pull) with its C(size) in bytes; empty when the image was there.
  returned: always
  type: dict
outcome:
  description:
    - V(done) (the desired server runs and passed its gate), V(failed), or V(ready) (O(state=prepared) or
      O(state=settled) stopped before a change to a server that passed its gate, or check mode).
  returned: always
  type: str
"""

import fcntl
import os
import signal
import time
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_engine as engine
from ansible_collections.onprem.vllm.plugins.module_utils import (
    deployment_record, docker_api, known_answers, kv_actual, vllm_http)
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import GateConfig, run_gate
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_loadgen import (
    build_body, chat_url, compare_to_baseline, run_sweep)

LABEL_ID = "onprem.vllm.deployment"
LABEL_SPEC = "onprem.vllm.container"
LABEL_SERVED = "onprem.vllm.served-model-name"
SETTLE_ONLY = "(settle only)"
PROBE_PROMPT = "Write a short story about a lighthouse keeper."


def server_facts(params):
    """What every result says of the server (the role publishes the result as vllm_server_result)."""
    container = params["container"] or {}
    return dict(state=params["state"], image=container.get("image") or params["image"],
                served_model_name=container.get("served_model_name", ""), local_url=params["url"],
                local_tls={k: params[k] for k in ("ca_path", "client_cert", "client_key")},
                endpoint=params["endpoint"])


class Deployment:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.name = self.p["name"]
        self.aside_name = self.name + "-previous"
        self.docker = docker_api.Docker(timeout=self.p["docker_timeout"])
        self.settle_only = self.p["state"] == "settled"
        self.spec = dict(self.p["container"] or {})
        self.spec_digest = docker_api.spec_digest(self.spec) if self.spec else ""
        # Settling only: a deployment no container carries, so nothing goes forward.
        self.desired = SETTLE_ONLY if self.settle_only else "%s/%s" % (self.p["deployment_id"], self.spec_digest)
        self.record = self.p["record"] or {}
        self.files = deployment_record.paths(self.p["config_dir"], self.name)
        self.url = self.p["url"].rstrip("/")
        self.server = vllm_http.Server(self.p, timeout=float(self.p["gate"].get("request_timeout", 60)))
        self.gates = {}
        self.failures = {}
        self.details = {}
        self.actions = []
        self.baseline = None
        self.changed = False
        self.image_pending = {}

    def exit(self, **result):
        self.module.exit_json(**dict(server_facts(self.p), **result))

    def fail(self, **result):
        fail(self.module, **result)

    # --- observe ---------------------------------------------------------------------------------------------------
    def _box(self, inspected):
        if inspected is None:
            return None
        labels = inspected.get("Config", {}).get("Labels") or {}
        identity = "%s/%s" % (labels.get(LABEL_ID, ""), labels.get(LABEL_SPEC, self.spec_digest))
        return engine.Container(identity, bool(inspected.get("State", {}).get("Running")))

    def observe(self):
        self.current_inspect = self.docker.inspect(self.name)
        self.aside_inspect = self.docker.inspect(self.aside_name)
        records = deployment_record.read_all(self.p["config_dir"], self.name)
        self.current_record_full = records["current"]
        record = dict(records["current"]) if records["current"] else None
        if record:
            record.pop("kv_cache", None)
        return (self._box(self.current_inspect), self._box(self.aside_inspect), records["marker"], record)

    # --- HTTP to the server ----------------------------------------------------------------------------------------
    def http(self, method, path, body, timeout=None):
        return self.server.request(method, path, body, timeout)

    def container_state(self):
        inspected = self.docker.inspect(self.name)
        if inspected is None:
            return None
        return dict(inspected["State"], RestartCount=inspected.get("RestartCount", 0))

    def run_healthcheck(self):
        """The container's own health check command, run once (the gate's last step, while Docker says "starting")."""
        inspected = self.docker.inspect(self.name) or {}
        check = (inspected.get("Config") or {}).get("Healthcheck") or {}
        argv = docker_api.healthcheck_argv(check.get("Test"))
        if argv is None:
            return 0, ""
        try:
            return self.docker.exec_run(self.name, argv, max(check.get("Timeout", 0) / 1e9, 30.0))
        except docker_api.DockerError as exc:
            return -1, str(exc)

    # --- gates -----------------------------------------------------------------------------------------------------
    def health_gate(self, served_model_name, runner):
        g = self.p["gate"]
        config = GateConfig(served_model_name=served_model_name, api_key=self.p["api_key"], runner=runner,
                            timeout=float(g.get("timeout", 900)), poll_interval=float(g.get("poll_interval", 2)))
        started = time.monotonic()
        result = run_gate(config, self.http, self.container_state, run_healthcheck=self.run_healthcheck)
        outcome = {"passed": result.passed, "failed_step": result.failed_step, "step_seconds": result.step_seconds,
                   "total_seconds": round(time.monotonic() - started, 3)}
        if result.passed:
            return outcome, ""
        msg = "health gate failed at step '%s': %s" % (result.failed_step, result.message)
        if result.last_response:
            msg += "; last response: %s" % result.last_response
        lines = self.p["log_lines"]
        msg += "; last %d lines of `docker logs %s`:\n%s" % (lines, self.name, self.docker.logs(self.name, lines))
        return outcome, msg

    def known_answer_gate(self, purpose, served_model_name):
        ka = self.p["known_answers"]
        if not ka.get("enabled", False) or purpose == engine.PURPOSE_RESTORED:
            return None, ""
        if purpose == engine.PURPOSE_UNCHANGED:
            mode = "gate" if ka.get("recheck") else "record_missing"
        else:
            mode = "accept" if ka.get("accept") and purpose == engine.PURPOSE_NEW else "gate"
        result = known_answers.run(
            lambda method, path, body: self.http(method, path, body, timeout=120),
            answers_file=deployment_record.answers_path(self.p["config_dir"], self.name),
            model=ka.get("model", ""), revision=ka.get("revision", ""),
            model_config=ka.get("model_config", ""), runner=self.p["runner"], served_model_name=served_model_name,
            prompts=ka.get("prompts") or [], image_prompt=boolean(ka.get("image_prompt", True), strict=False),
            positions=int(ka.get("positions", 16)), top_logprobs=5,
            max_logprob_delta=float(ka.get("max_logprob_delta", 0.5)), tie_margin=float(ka.get("tie_margin", 0.5)),
            min_cosine=float(ka.get("min_cosine", 0.995)), mode=mode, image=self.spec["image"],
            read_json=deployment_record.read,
            write_json=lambda path, content: deployment_record.write(path, deployment_record.dumps(content)),
            now=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.changed |= result["changed"]
        return result, result.pop("error")

    def sweep(self, served_model_name):
        b = self.p["benchmark"]
        levels = [int(c) for c in b.get("concurrency", [4])]
        count = int(b.get("num_requests", 32))
        # Exactly max_tokens per request on both sides: the comparison is of the same work.
        body = build_body(served_model_name, PROBE_PROMPT, None, int(b.get("max_tokens", 32)), True, None)
        return run_sweep(chat_url(self.url + "/v1"), self.p["api_key"], body, levels, count, warmup=1,
                         timeout=120, ssl_verify=self.server.context or False)

    def benchmark_gate(self):
        b = self.p["benchmark"]
        if not b or self.baseline is None:
            return None, ""
        after = self.sweep(self.spec["served_model_name"])
        found, _comparisons = compare_to_baseline(after["levels"], self.baseline,
                                                  float(b.get("max_throughput_drop_pct", 20)),
                                                  float(b.get("max_ttft_p99_rise_pct", 100)))
        figures = [{"concurrency": lv["concurrency"], "output_throughput": lv.get("output_throughput"),
                    "ttft_p99_ms": lv.get("ttft_p99_ms")} for lv in after["levels"]]
        result = {"before": self.baseline_figures, "after": figures, "regressions": found}
        if found:
            return result, ("REGRESSION against the baseline (thresholds: throughput drop > %s%%, p99 TTFT rise > "
                            "%s%%): %s" % (b.get("max_throughput_drop_pct", 20), b.get("max_ttft_p99_rise_pct", 100),
                                           " | ".join(found)))
        return result, ""

    def measure_baseline(self):
        """Before a replacement with the benchmark gate: the running server's figures (it must serve)."""
        labels = (self.current_inspect or {}).get("Config", {}).get("Labels") or {}
        served = labels.get(LABEL_SERVED, self.spec["served_model_name"])
        outcome, msg = self.health_gate(served, "generate")
        if not outcome["passed"]:
            self.fail(msg="The benchmark gate needs the running server as its baseline, but it does not "
                      "serve (%s). Nothing was changed. Fix the running server, or deploy without "
                      "vllm_server_gate_benchmark (onprem_vllm_rollout_canary_benchmark for a rollout)."
                      % msg, actions=self.actions)
        before = self.sweep(served)
        self.baseline = before["levels"]
        self.baseline_figures = [{"concurrency": lv["concurrency"], "output_throughput": lv.get("output_throughput"),
                                  "ttft_p99_ms": lv.get("ttft_p99_ms")} for lv in before["levels"]]

    def kv_check(self):
        kv = self.p["kv"]
        entry, why, warning = kv_actual.check(lambda: self.http("GET", "/metrics", None).body,
                                              kv.get("predicted") or {}, float(kv.get("max_difference_pct", 5)))
        if why:
            self.module.warn("KV check: %s; the deployment record keeps no actual KV allocation." % why)
        if warning:
            self.module.warn(warning)
        return entry

    def gate(self, action, identity):
        labels = (self.current_inspect or {}).get("Config", {}).get("Labels") or {}
        served = labels.get(LABEL_SERVED, self.spec.get("served_model_name", ""))
        desired = identity == self.desired
        outcome, msg = self.health_gate(served, self.p["runner"])
        details = {"gate": outcome}
        if not msg:
            details["known_answers"], msg = self.known_answer_gate(action.purpose, served)
        if not msg and desired and action.purpose == engine.PURPOSE_NEW:
            details["benchmark"], msg = self.benchmark_gate()
        if not msg and action.purpose != engine.PURPOSE_RESTORED:
            details["kv_check"] = self.kv_check()
        self.gates[identity] = not msg
        self.details[identity] = details
        if msg:
            self.failures[identity] = msg

    # --- act -------------------------------------------------------------------------------------------------------
    def write_record(self, path, content):
        self.changed |= deployment_record.write(path, deployment_record.dumps(content))

    def with_kv(self, record, identity):
        kv = self.details.get(identity, {}).get("kv_check")
        return dict(record, kv_cache=kv) if kv is not None else dict(record)

    def act(self, action):
        a = action.name
        current_identity = self._box(self.current_inspect).deployment if self.current_inspect else ""
        self.actions.append({"action": a, "purpose": action.purpose, "why": action.why})
        if a == engine.GATE:
            self.gate(action, current_identity)
            return
        self.changed = True
        if a == engine.START:
            try:
                self.docker.start(self.name)
            except docker_api.DockerError as exc:
                self.gates[current_identity] = False
                self.failures[current_identity] = "the container does not start: %s" % exc
        elif a == engine.CREATE:
            self.docker.remove(self.name)
            labels = {"onprem.vllm.role": "vllm_server", LABEL_SERVED: self.spec["served_model_name"],
                      LABEL_ID: self.p["deployment_id"], LABEL_SPEC: self.spec_digest}
            try:
                self.docker.create(self.name, docker_api.create_body(self.spec, labels))
                self.docker.start(self.name)
            except docker_api.DockerError as exc:
                self.gates[self.desired] = False
                self.failures[self.desired] = "the new container does not start: %s" % exc
        elif a == engine.STOP_CURRENT:
            self.docker.stop(self.name, self.p["stop_timeout"])
        elif a == engine.SET_ASIDE:
            self.docker.rename(self.name, self.aside_name)
        elif a == engine.RESTORE_ASIDE:
            self.docker.rename(self.aside_name, self.name)
        elif a == engine.REMOVE_CURRENT:
            self.docker.remove(self.name)
        elif a == engine.REMOVE_ASIDE:
            self.docker.remove(self.aside_name)
        elif a == engine.WRITE_MARKER:
            if self.p["benchmark"] and self.current_inspect and self.baseline is None and \
                    self.current_inspect.get("State", {}).get("Running"):
                self.measure_baseline()
            # The record it replaces, where a server runs under the name (a first deployment replaces none).
            replaced = self.current_record_full if self.current_inspect else None
            self.write_record(self.files["marker"], deployment_record.marker(self.record, replaced, self.desired))
        elif a == engine.FINISH_RECORDS:
            marker = deployment_record.read(self.files["marker"])
            writes = deployment_record.passed_writes(self.p["config_dir"], self.name, marker,
                                                     self.with_kv(marker["new"], current_identity))
            for path, content in writes:
                self.changed |= deployment_record.write(path, content)
        elif a == engine.RECORD:
            self.write_record(self.files["current"], self.with_kv(self.record, self.desired))
        elif a == engine.REMOVE_MARKER:
            deployment_record.remove(self.files["marker"])
        else:
            raise ValueError("unknown action %s" % a)

    # --- the run ---------------------------------------------------------------------------------------------------
    def result(self, **extra):
        details = self.details.get(self.desired, {})
        ka = details.get("known_answers") or {}
        return dict(changed=self.changed, actions=self.actions, gate=details.get("gate", {}),
                    known_answers={k: ka[k] for k in ("outcome", "seconds", "failures", "note") if k in ka},
                    kv_check=details.get("kv_check", {}), benchmark=details.get("benchmark") or {},
                    deployment=self.desired, **extra)

    def failure_message(self, action):
        new_failure = self.failures.get(self.desired, "the new server failed")
        if action.why == "the unchanged server failed its gate":
            return new_failure
        if not self.current_inspect:
            return ("The first deployment of %s failed and was removed (nothing is left half-started; the HF cache is "
                    "untouched): %s" % (self.name, new_failure))
        image = self.current_inspect.get("Config", {}).get("Image", "")
        restored = self._box(self.current_inspect).deployment
        if not self.gates.get(restored, False):
            return ("The new server failed AND the restored previous server did not pass its gate (%s). The new "
                    "server's failure: %s" % (self.failures.get(restored, "no gate"), new_failure))
        return "Rolled back: the previous server (%s) serves again. The new server failed: %s" % (image, new_failure)

    def stage_image(self):
        """The pinned image on the host: there, loaded from its archive, or pulled. Check mode proves it can be."""
        ref = self.p["image"] or self.spec["image"]
        if self.docker.image(ref) is not None:
            return
        archive = self.p["image_archive"]
        host = self.p["host_name"] or "the host"
        if archive:
            if not os.path.isfile(archive):
                self.fail(msg="Image %s is not on %s and the archive %s does not exist: copy the `docker "
                          "save` tarball there or fix vllm_server_image_tag / vllm_server_image_archive."
                          % (ref, host, archive))
            size = os.path.getsize(archive)
            root = self.docker.root_dir()
            stat = os.statvfs(root)
            free = stat.f_bavail * stat.f_frsize
            if free < 2 * size:
                gib = 1024.0 ** 3
                self.fail(msg=(
                    "Loading %s (%.1f GiB) needs about %.1f GiB free under %s (Docker unpacks the archive before "
                    "applying its layers); %.1f GiB are free on %s: remove unused images (docker image prune -a) or "
                    "move Docker's data-root." % (archive, size / gib, 2 * size / gib, root, free / gib, host)))
            self.actions.append({"action": "load_image", "purpose": "", "why": "%s is not on the host" % ref,
                                 "planned": self.module.check_mode})
            self.image_pending = {"image": ref, "archive": archive, "size": size}
            if self.module.check_mode:
                self.changed = True
                return
            loaded = self.docker.load(archive)
            self.changed = True
            if ref.split("@")[0] not in loaded:
                self.fail(msg="%s holds %s, not %s: fix vllm_server_image_tag or the archive."
                          % (archive, ", ".join(loaded) or "no tagged image", ref))
            return
        self.image_pending = {"image": ref, "archive": "", "size": 0}
        repository, _at, digest = ref.partition("@")
        repository, _colon, tag = repository.rpartition(":")
        self.actions.append({"action": "pull_image", "purpose": "", "why": "%s is not on the host" % ref,
                             "planned": self.module.check_mode})
        self.changed = True
        if not self.module.check_mode:
            self.docker.pull(repository, digest or tag)

    def lock(self):
        """One run at a time per deployment: a run whose controller died may still be acting on the host."""
        if not os.path.isdir(self.p["config_dir"]):
            return None  # nothing recorded yet (check mode before the role wrote its folders)
        handle = open(os.path.join(self.p["config_dir"], ".%s.lock" % self.name), "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        return handle

    def run(self):
        self._lock = self.lock()
        if self.p["state"] != "settled":
            self.stage_image()
        if self.p["state"] == "staged":
            self.exit(changed=self.changed, actions=self.actions, outcome="ready", replaces=False,
                      rolled_back=False, image_pending=self.image_pending)
        prepare = self.p["state"] != "deployed"
        for _step in range(40):
            current, aside, marker, record = self.observe()
            action = engine.next_action(self.desired, self.record, current, aside, marker, record, self.gates)
            settling = marker is not None or aside is not None
            if self.module.check_mode or (prepare and (action.name in engine.REPLACING or not settling)):
                replaces = action.name in engine.REPLACING
                diff = {"before": self.current_record_full or {}, "after": self.record} if replaces else {}
                if self.module.check_mode:
                    self.changed = self.changed or action.name not in (engine.GATE, engine.DONE)
                    self.actions.append({"action": action.name, "purpose": action.purpose, "why": action.why,
                                         "planned": True})
                self.exit(replaces=replaces and not self.module.check_mode, rolled_back=False,
                          diff=diff, outcome="ready", **self.result())
            if action.name == engine.DONE:
                self.exit(replaces=any(a["action"] == engine.CREATE for a in self.actions),
                          rolled_back=False, outcome="done", **self.result())
            if action.name == engine.FAIL:
                rolled_back = action.why != "the unchanged server failed its gate"
                self.fail(msg=self.failure_message(action), replaces=rolled_back, rolled_back=rolled_back,
                          **self.result())
            self.act(action)
            if self.p["fault_after"] == action.name:
                os.kill(os.getpid(), signal.SIGKILL)
        self.fail(msg="the deployment of %s did not settle in 40 actions: %s" % (self.name, self.actions),
                  **self.result())


def fail(module, **result):
    """Every failure's result: the server's facts, and what the rollout's rescue reads (nothing replaced or rolled
    back unless the result says so)."""
    failed = dict(server_facts(module.params), replaces=False, rolled_back=False, outcome="failed")
    failed.update(result)
    module.fail_json(**failed)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vllm_http.SERVER_ARGUMENT_SPEC,
            name=dict(type="str", required=True),
            config_dir=dict(type="path", required=True),
            state=dict(type="str", default="deployed", choices=["staged", "settled", "prepared", "deployed"]),
            deployment_id=dict(type="str"),
            record=dict(type="dict"),
            container=dict(type="dict", options=dict(
                image=dict(type="str", required=True),
                command=dict(type="list", elements="str", required=True),
                env=dict(type="dict", default={}),
                bind_address=dict(type="str", required=True),
                port=dict(type="int", required=True),
                container_port=dict(type="int", required=True),
                volumes=dict(type="list", elements="str", default=[]),
                ipc_host=dict(type="bool", default=True),
                shm_size=dict(type="str", default="16g"),
                gpu_uuids=dict(type="list", elements="str", default=[]),
                healthcheck=dict(type="dict", required=True),
                restart_policy=dict(type="str", default="unless-stopped"),
                log_options=dict(type="dict", default={}),
                served_model_name=dict(type="str", required=True),
            )),
            runner=dict(type="str", default="generate", choices=["generate", "pooling"]),
            gate=dict(type="dict", default={}),
            known_answers=dict(type="dict", default={}),
            kv=dict(type="dict", default={}),
            benchmark=dict(type="dict", default={}),
            stop_timeout=dict(type="int", default=10),
            docker_timeout=dict(type="int", default=600),
            log_lines=dict(type="int", default=40),
            fault_after=dict(type="str", default=""),
            image=dict(type="str", default=""),
            image_archive=dict(type="str", default=""),
            host_name=dict(type="str", default=""),
            endpoint=dict(type="str", default=""),
        ),
        required_if=[("state", "staged", ("image",)),
                     ("state", "prepared", ("deployment_id", "record", "container")),
                     ("state", "deployed", ("deployment_id", "record", "container"))],
        supports_check_mode=True,
    )
    problem = vllm_http.tls_problem(module.params) or (
        "" if module.check_mode else vllm_http.tls_files_problem(module.params))
    if problem:
        fail(module, msg=problem)
    if module.params["container"]:
        env = module.params["container"]["env"]
        module.params["container"]["env"] = {str(k): str(v) for k, v in env.items()}
    try:
        Deployment(module).run()
    except (docker_api.DockerError, deployment_record.RecordError, OSError, ValueError) as exc:
        fail(module, msg="vllm_deployment of %s: %s" % (module.params["name"], exc))


if __name__ == "__main__":
    main()
