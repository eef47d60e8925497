#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_benchmark
short_description: Streaming load sweep against vLLM servers, with files, a report and a regression gate
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Sends streaming C(/v1/chat/completions) requests (C(stream_options.include_usage)) to each target, one target
    after the other, at each concurrency level of a sweep, and measures TTFT mean/p50/p99, decode tokens/s per
    request, aggregate output tokens/s, request rate and errors.
  - Meant to run on the control node (C(delegate_to=localhost), C(run_once)) so it measures what clients see over
    the network, drives every host from one place, needs nothing installed on the hosts and leaves its files where
    the operator is. The load generator is standard library only (asyncio, raw HTTP/1.1); the charts are drawn
    with matplotlib.
  - Writes into O(results_dir) a JSON and a CSV file per host, C(throughput.png) and C(ttft_p99.png) (one line per
    host; not with O(charts=false)), C(summary.json) and one self-contained C(report.html) (the same charts inlined
    as SVG, a table per host, vLLM version, model, flags and KV-cache prediction beside the measured numbers; no
    script, no network).
  - Results are always written, also when requests fail; they are then marked C(partial) and the module fails with
    the reason (unless O(fail_on_errors=false)). A host that answers no request at a level is not loaded further.
  - With O(baseline_dir), each host's levels are compared to its saved baseline; a drop of output throughput or a
    rise of p99 TTFT beyond the thresholds fails the task (the rollout canary's gate).
  - While it runs, a progress line is written to the controlling terminal when there is one, and every event to
    C(progress.log) in O(results_dir).
requirements:
  - matplotlib, on the machine running the module (the control node), unless O(charts=false)
options:
  targets:
    description: The servers to load.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Host name used in file names, plots and messages.
        type: str
        required: true
      url:
        description: The server's OpenAI base URL, e.g. C(http://172.30.99.11:8000/v1).
        type: str
        required: true
      api_key:
        description: The server's API key (Bearer); empty for none.
        type: str
        default: ""
      model:
        description: The served model name.
        type: str
        required: true
      meta:
        description: What the report shows beside the numbers (C(vllm_version), C(image), C(model), C(args), C(kv_plan)).
        type: dict
        default: {}
      headers:
        description: More request headers, e.g. the gateway's C(X-Onprem-Canary), which pins the requests to one server
          behind it (onprem.vllm.gateway_canary_token). Never logged.
        type: dict
        default: {}
      ca_pem:
        description: The certificate (PEM) the target's https certificate must chain to, e.g. the gateway's own
          self-signed one; empty uses the system's CAs (and O(validate_certs)).
        type: str
        default: ""
  concurrency:
    description: Concurrency levels of the sweep; each must be at least 1.
    type: list
    elements: raw
    default: [1, 4, 8, 16, 32]
  num_requests:
    description: Requests per level; 0 means max(16, 4 x concurrency).
    type: int
    default: 0
  prompt:
    description: The user message.
    type: str
    default: Explain in three sentences what a KV cache is and why it limits how many requests a GPU serves at once.
  system_prompt:
    description: An optional system message.
    type: str
    default: ""
  max_tokens:
    description: Output tokens asked per request.
    type: int
    default: 128
  ignore_eos:
    description: Generate exactly O(max_tokens) (vLLM's C(ignore_eos)), as C(vllm bench serve --ignore-eos).
    type: bool
    default: false
  temperature:
    description: Sampling temperature; unset leaves the server's default.
    type: float
  warmup:
    description: Warm-up requests before the sweep (not measured).
    type: int
    default: 1
  request_timeout:
    description: Seconds one request may take.
    type: float
    default: 120
  time_budget:
    description: Seconds after which no new level starts (the results are then partial).
    type: int
    default: 1800
  validate_certs:
    description: Verify TLS certificates of https endpoints.
    type: bool
    default: true
  results_dir:
    description: Folder on the machine running the module for this run's files; created when missing.
    type: path
    required: true
  run_id:
    description: Name of the run, shown in the report.
    type: str
    default: ""
  charts:
    description:
      - Draw the charts with matplotlib. V(false) writes every other file and a report of tables only, and needs no
        matplotlib (the rollout's benchmark gate runs the module on the GPU host, whose Python has no matplotlib).
    type: bool
    default: true
  dashboard_url:
    description:
      - URL of the fleet's Grafana dashboard (roles/monitoring/files/grafana/onprem-vllm-fleet.json imported, uid
        C(onprem-vllm-fleet)), e.g. C(https://grafana.example.org/d/onprem-vllm-fleet). The report links to it at the
        run's time range. Empty - the report names the dashboard file to import.
    type: str
    default: ""
  baseline_dir:
    description: Folder of saved baselines, one C(<host>.json) per host; empty disables the regression gate.
    type: path
    default: ""
  save_baseline:
    description: Save this run's levels as each host's baseline (only hosts with complete results).
    type: bool
    default: false
  max_throughput_drop_pct:
    description: Fail when output throughput at a level drops more than this many percent below the baseline.
    type: float
    default: 10
  max_ttft_p99_rise_pct:
    description: Fail when p99 TTFT at a level rises more than this many percent above the baseline.
    type: float
    default: 25
  fail_on_errors:
    description: Fail the task when any request failed (results are written and marked partial either way).
    type: bool
    default: true
  progress:
    description: Show a progress line on the controlling terminal (when there is one).
    type: bool
    default: true
attributes:
  check_mode:
    support: partial
    description: In check mode the input is checked and no load is sent and no file is written.
    details: Check mode validates the targets, concurrency levels and limits and reports how many requests would be sent.
  diff_mode:
    support: none
    description: No diff; the files written are listed in the result.
"""

EXAMPLES = r"""
- name: Sweep every vLLM server from the control node
  onprem.vllm.vllm_benchmark:
    targets:
      - name: ws1
        url: http://172.30.99.11:8000/v1
        api_key: "{{ onprem_vllm_api_key }}"
        model: qwen3-lab
    concurrency: [1, 4, 8, 16, 32]
    max_tokens: 128
    results_dir: ./benchmark-results/20261130T120000
  delegate_to: localhost
  run_once: true
  no_log: false

- name: Canary gate against the saved baseline
  onprem.vllm.vllm_benchmark:
    targets: "{{ targets }}"
    concurrency: [1, 8]
    results_dir: ./benchmark-results/canary
    baseline_dir: ./benchmark-baselines
    max_throughput_drop_pct: 10
    max_ttft_p99_rise_pct: 25
  delegate_to: localhost
"""

RETURN = r"""
results_dir:
  description: Where the files are.
  type: str
  returned: always
report:
  description: Path of the HTML report.
  type: str
  returned: when not in check mode
files:
  description: Every file written.
  type: list
  elements: str
  returned: when not in check mode
partial:
  description: True when a request failed or a level was not run on any host.
  type: bool
  returned: always
hosts:
  description:
    - Per host, the measured levels (concurrency, output_throughput, ttft_mean_ms, ttft_p50_ms, ttft_p99_ms,
      decode_tps_mean, errors...), partial flag and problems.
  type: list
  elements: dict
  returned: when not in check mode
regressions:
  description: 'Regressions against the baselines, one string per host and level (C(host: concurrency C: ...)).'
  type: list
  elements: str
  returned: always
"""

import datetime
import json
import os
import ssl
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.onprem.vllm.plugins.module_utils import bench_report
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_loadgen import (
    LoadgenError, build_body, chat_url, check_concurrency, check_positive, compare_to_baseline, run_sweep,
    sweep_failures)


class Progress:
    """One line on the terminal (when there is one) and every event in progress.log."""

    def __init__(self, path, enabled):
        self.log = open(path, "a")
        self.tty = None
        if enabled:
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None
        self.host = ""
        self.failed = 0

    def event(self, event):
        event = dict(event, host=self.host, time=round(time.time(), 3))
        if event.get("phase") == "level" and not event.get("ok"):
            self.failed += 1
        self.log.write(json.dumps(event, sort_keys=True, default=str) + "\n")
        self.log.flush()
        if self.tty is None:
            return
        if event["phase"] == "level":
            line = "[vllm_benchmark] %s  concurrency %d  %d/%d requests  %d failed" % (
                self.host, event["concurrency"], event["done"], event["total"], self.failed)
        elif event["phase"] == "level_done":
            summary = event["summary"]
            line = "[vllm_benchmark] %s  concurrency %d done: %s output tok/s, TTFT p99 %s ms\n" % (
                self.host, event["concurrency"], summary["output_throughput"], summary["ttft_p99_ms"])
        else:
            line = "[vllm_benchmark] %s  %s" % (self.host, event["phase"])
        try:
            self.tty.write("\r\033[K" + line)
            self.tty.flush()
        except OSError:
            self.tty = None

    def close(self):
        self.log.close()
        if self.tty is not None:
            try:
                self.tty.write("\r\033[K")
                self.tty.close()
            except OSError:
                pass


def _safe_name(name):
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "host"


def _write(path, data, files):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as handle:
        handle.write(data)
    files.append(path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            targets=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                url=dict(type="str", required=True),
                api_key=dict(type="str", default="", no_log=True),
                model=dict(type="str", required=True),
                meta=dict(type="dict", default={}),
                headers=dict(type="dict", default={}, no_log=True),
                ca_pem=dict(type="str", default=""),
            )),
            concurrency=dict(type="list", elements="raw", default=[1, 4, 8, 16, 32]),
            num_requests=dict(type="int", default=0),
            prompt=dict(type="str",
                        default="Explain in three sentences what a KV cache is and why it limits how many requests "
                                "a GPU serves at once."),
            system_prompt=dict(type="str", default=""),
            max_tokens=dict(type="int", default=128, no_log=False),
            ignore_eos=dict(type="bool", default=False),
            temperature=dict(type="float"),
            warmup=dict(type="int", default=1),
            request_timeout=dict(type="float", default=120),
            time_budget=dict(type="int", default=1800),
            validate_certs=dict(type="bool", default=True),
            results_dir=dict(type="path", required=True),
            run_id=dict(type="str", default=""),
            charts=dict(type="bool", default=True),
            dashboard_url=dict(type="str", default=""),
            baseline_dir=dict(type="path", default=""),
            save_baseline=dict(type="bool", default=False),
            max_throughput_drop_pct=dict(type="float", default=10),
            max_ttft_p99_rise_pct=dict(type="float", default=25),
            fail_on_errors=dict(type="bool", default=True),
            progress=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["charts"] and not bench_report.HAS_MATPLOTLIB:
        # Before any load: a sweep can take half an hour, its report must not fail at the end.
        module.fail_json(msg=missing_required_lib("matplotlib"), exception=bench_report.MATPLOTLIB_IMPORT_ERROR)
    try:
        levels = check_concurrency(params["concurrency"])
        check_positive("max_tokens", params["max_tokens"], 1000000)
        if params["num_requests"] < 0:
            raise LoadgenError("num_requests must be 0 (automatic) or more (got %d)" % params["num_requests"])
        if params["warmup"] < 0:
            raise LoadgenError("warmup must be 0 or more (got %d)" % params["warmup"])
        if not params["targets"]:
            raise LoadgenError("targets is empty: no vLLM server to benchmark (is the vllm_servers group empty?)")
        names = [t["name"] for t in params["targets"]]
        if len(set(names)) != len(names):
            raise LoadgenError("target names must be unique (got %s)" % names)
        urls = {t["name"]: chat_url(t["url"]) for t in params["targets"]}
    except LoadgenError as exc:
        module.fail_json(msg="vllm_benchmark: %s" % exc, partial=False, regressions=[],
                         results_dir=params["results_dir"])

    counts = {level: (params["num_requests"] or max(16, 4 * level)) for level in levels}
    if module.check_mode:
        module.exit_json(changed=False, results_dir=params["results_dir"], partial=False, regressions=[],
                         msg="check mode: would send %d requests to each of %s"
                         % (sum(counts.values()), ", ".join(names)))

    results_dir = params["results_dir"]
    os.makedirs(results_dir, exist_ok=True)
    run_id = params["run_id"] or os.path.basename(os.path.normpath(results_dir))
    started_at = time.time()
    started = datetime.datetime.fromtimestamp(started_at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    settings = {
        "concurrency": levels, "requests_per_level": counts, "max_tokens": params["max_tokens"],
        "ignore_eos": params["ignore_eos"], "prompt": params["prompt"], "system_prompt": params["system_prompt"],
        "warmup": params["warmup"], "temperature": params["temperature"], "request_timeout": params["request_timeout"],
    }
    files = []
    progress = Progress(os.path.join(results_dir, "progress.log"), params["progress"])
    files.append(os.path.join(results_dir, "progress.log"))
    deadline = time.monotonic() + params["time_budget"]
    hosts, problems, regressions = [], [], []
    try:
        for target in params["targets"]:
            progress.host = target["name"]
            progress.failed = 0
            body = build_body(target["model"], params["prompt"], params["system_prompt"], params["max_tokens"],
                              params["ignore_eos"], params["temperature"])
            # A target's own CA (e.g. the gateway's self-signed certificate) is the only one trusted for it.
            verify = ssl.create_default_context(cadata=target["ca_pem"]) if target["ca_pem"] else params["validate_certs"]
            sweep = run_sweep(urls[target["name"]], target["api_key"], body, levels, counts, warmup=params["warmup"],
                              timeout=params["request_timeout"], ssl_verify=verify,
                              progress=progress.event, deadline=deadline, headers=target["headers"])
            host_problems = sweep_failures(target["name"], sweep)
            measured = {level["concurrency"] for level in sweep["levels"]}
            if not sweep["partial"] and measured != set(levels):
                sweep["partial"] = True
            meta = dict(target.get("meta") or {})
            meta.setdefault("model", target["model"])
            host = {"name": target["name"], "url": urls[target["name"]], "levels": sweep["levels"],
                    "partial": sweep["partial"], "problems": host_problems, "warmup": sweep["warmup"],
                    "meta": meta, "regressions": [], "baseline_compared": False, "baseline": None}
            if params["baseline_dir"]:
                path = os.path.join(params["baseline_dir"], _safe_name(target["name"]) + ".json")
                if os.path.exists(path):
                    with open(path) as handle:
                        baseline = json.load(handle)
                    found, comparisons = compare_to_baseline(sweep["levels"], baseline.get("levels"),
                                                             params["max_throughput_drop_pct"],
                                                             params["max_ttft_p99_rise_pct"])
                    host.update(regressions=found, baseline_compared=True,
                                baseline={"path": path, "run_id": baseline.get("run_id"),
                                          "comparisons": comparisons})
                    regressions += ["%s: %s" % (target["name"], text) for text in found]
                else:
                    host["baseline"] = {"path": path, "missing": True}
            problems += host_problems
            hosts.append(host)
            record = {"run_id": run_id, "started": started, "host": target["name"], "settings": settings,
                      "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
            record.update(host)
            stem = os.path.join(results_dir, _safe_name(target["name"]))
            _write(stem + ".json", json.dumps(record, indent=2, sort_keys=True) + "\n", files)
            _write(stem + ".csv", bench_report.levels_csv(target["name"], sweep["levels"]), files)
    finally:
        progress.close()

    figures = bench_report.charts(hosts) if params["charts"] else {}
    for stem, figure in sorted(figures.items()):
        _write(os.path.join(results_dir, stem + ".png"), bench_report.png(figure), files)
    run = {"run_id": run_id, "started": started, "settings": settings,
           "dashboard": {"url": params["dashboard_url"], "from_ms": int(started_at * 1000),
                         "to_ms": int(time.time() * 1000) + 1}}
    report = os.path.join(results_dir, "report.html")
    plots = {stem: bench_report.svg(figure) for stem, figure in figures.items()}
    _write(report, bench_report.html_report(run, hosts, plots), files)
    partial = any(h["partial"] for h in hosts)
    summary = {"run_id": run_id, "started": started, "partial": partial, "problems": problems,
               "regressions": regressions, "settings": settings,
               "hosts": [{k: h[k] for k in ("name", "url", "partial", "levels", "problems", "regressions")}
                         for h in hosts]}
    _write(os.path.join(results_dir, "summary.json"), json.dumps(summary, indent=2, sort_keys=True) + "\n", files)

    saved = []
    if params["save_baseline"] and params["baseline_dir"]:
        os.makedirs(params["baseline_dir"], exist_ok=True)
        for host in hosts:
            if host["partial"]:
                continue
            path = os.path.join(params["baseline_dir"], _safe_name(host["name"]) + ".json")
            _write(path, json.dumps({"run_id": run_id, "started": started, "host": host["name"],
                                     "settings": settings, "levels": host["levels"]}, indent=2, sort_keys=True)
                   + "\n", saved)
    result = dict(changed=True, results_dir=results_dir, report=report, files=files + saved, partial=partial,
                  hosts=summary["hosts"], regressions=regressions, baselines_saved=saved)
    messages = []
    if problems and params["fail_on_errors"]:
        messages.append("PARTIAL results (written to %s): %s" % (results_dir, " | ".join(problems)))
    if regressions:
        messages.append("REGRESSION against the baseline (thresholds: throughput drop > %s%%, p99 TTFT rise > %s%%): %s"
                        % (params["max_throughput_drop_pct"], params["max_ttft_p99_rise_pct"],
                           " | ".join(regressions)))
    if messages:
        module.fail_json(msg="vllm_benchmark: " + " ; ".join(messages), **result)
    module.exit_json(msg="benchmark of %d host(s) written to %s" % (len(hosts), report), **result)


if __name__ == "__main__":
    main()
