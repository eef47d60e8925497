# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/monitoring's alert rules and fleet dashboard, statically: every rule has a threshold variable, a runbook and
metric names that real exporters export (recorded /metrics of the lab's vLLM 0.32.0, HAProxy 2.6.12 and Debian's
node_exporter, and the Xid monitor's own textfile); the dashboard validates against Grafana's published schema.
promtool's check and unit tests of the rules run on a fleet host (molecule/fleet/alerting_checks.yml)."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re

import jinja2
import jsonschema
import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLE = os.path.join(ROOT, "roles", "monitoring")
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "monitoring")
# Names the rules and the dashboard may use: everything with these prefixes must be exported by someone.
METRIC_RE = re.compile(r"\b((?:vllm:|haproxy_|node_|onprem_vllm_)[a-zA-Z0-9_:]*)|\b(up)\b(?=\s*[{=<>!])")


def read(*parts):
    with open(os.path.join(*parts)) as handle:
        return handle.read()


def defaults():
    return yaml.safe_load(read(ROLE, "defaults", "main.yml"))


def render_rules(overrides=None):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return env.from_string(read(ROLE, "templates", "onprem-vllm-alerts.rules.yml.j2")).render(
        dict(defaults(), **(overrides or {})))


def xid_monitor_metrics():
    spec = importlib.util.spec_from_file_location("xid_monitor_for_test", os.path.join(ROLE, "files", "xid_monitor.py"))
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    state = {"last_success": 1, "counts": {"block": 1}, "last_seen": {"79|0000:01:00.0|block": 1}}
    return module.metrics_text(state, True, 0, 2, ({"events": [{"code": 79, "pci_bus_id": "0000:01:00.0"}]}, None))


def exported():
    names = set()
    for name in ("vllm-0.32.0-lab.metrics", "haproxy-2.6.12-promex.metrics", "node-exporter-1.5.0-lab.metrics"):
        names |= set(re.findall(r"(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)", read(FIXTURES, name)))
    names |= set(re.findall(r"(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)", xid_monitor_metrics()))
    names |= set(re.findall(r'(?m)^\s*(onprem_vllm_hf_cache_filesystem)\{', read(ROLE, "vars", "main.yml")))
    names |= set(re.findall(r"(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)", usage_service_metrics()))
    return names | {"up"}


def usage_service_metrics():
    spec = importlib.util.spec_from_file_location(
        "usage_service_for_test", os.path.join(ROOT, "roles", "gateway", "files", "onprem_gateway_usage.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    states = [{"client": "c", "period": "day", "tokens": 10, "models": [], "used": 1}]
    return module.render_metrics({("2026-12-06", "c", "m"): [1, 2, 3]}, states, 1, 0, 0.0)


def metric_names(expr):
    return {a or b for a, b in METRIC_RE.findall(expr)}


def unknown_metrics(rules_text):
    known = exported()
    out = {}
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            missing = sorted(metric_names(rule["expr"]) - known)
            if missing:
                out[rule["alert"]] = missing
    return out


def test_every_rule_has_a_runbook_a_summary_a_severity_and_a_threshold_variable():
    template = read(ROLE, "templates", "onprem-vllm-alerts.rules.yml.j2")
    rules = [r for g in yaml.safe_load(render_rules())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {
        "VllmServerDown", "VllmKvCacheNearlyFull", "VllmPreemptionsIncreasing", "VllmRequestsWaiting",
        "VllmTtftP99High", "GatewayHostOutOfRotation", "GatewayServerRejectsKey",
        "GatewayMetricsDown", "GpuCriticalXid", "GpuFaultDrained",
        "XidMonitorFailing", "HfCacheDiskNearlyFull", "ClientTokenBudgetNearlyUsed", "ClientTokenBudgetExhausted",
        "UsageCountsStale"}
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert len(rule["annotations"]["runbook"]) > 60 and rule["annotations"]["summary"], rule["alert"]
    # Each rule's block in the template names at least one monitoring_alert_* variable (its threshold or duration).
    blocks = re.split(r"\n      - alert: ", template)[1:]
    assert len(blocks) == len(rules)
    for block in blocks:
        assert re.search(r"\{\{ monitoring_alert_\w+", block), block.splitlines()[0]


def test_threshold_variables_are_defaults_and_documented():
    template = read(ROLE, "templates", "onprem-vllm-alerts.rules.yml.j2")
    used = set(re.findall(r"\b(monitoring_alert_\w+)", template))
    specs = yaml.safe_load(read(ROLE, "meta", "argument_specs.yml"))["argument_specs"]["main"]["options"]
    declared = {k for k in defaults() if k.startswith("monitoring_alert_")}
    assert used == declared
    assert declared <= set(specs)


def test_every_metric_the_rules_use_is_exported():
    assert unknown_metrics(render_rules()) == {}
    used = set()
    for group in yaml.safe_load(render_rules())["groups"]:
        for rule in group["rules"]:
            used |= metric_names(rule["expr"])
    assert {"vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:num_requests_waiting",
            "vllm:time_to_first_token_seconds_bucket", "haproxy_server_status", "node_filesystem_avail_bytes",
            "onprem_vllm_xid_last_event_timestamp_seconds", "onprem_vllm_hf_cache_filesystem"} <= used


@pytest.mark.parametrize("good,bad", [
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the pre-V1 name
    ("vllm:num_preemptions_total", "vllm:num_preemption_total"),
    ("haproxy_server_status", "haproxy_backend_server_status"),
])
def test_a_misspelled_or_renamed_metric_is_caught(good, bad):
    text = render_rules()
    assert good in text
    found = unknown_metrics(text.replace(good, bad))
    assert found and all(bad in names for names in found.values())


def test_lab_thresholds_render_valid_yaml():
    rules = yaml.safe_load(render_rules({"monitoring_alert_server_down_for": "10s"}))
    down = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "VllmServerDown"][0]
    assert down["for"] == "10s"


# ---------- the fleet dashboard ----------

def dashboard():
    return json.loads(read(ROLE, "files", "grafana", "onprem-vllm-fleet.json"))


def schema_errors(doc):
    schema = json.loads(read(FIXTURES, "grafana-dashboard.jsonschema.json"))
    return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def test_dashboard_validates_against_grafanas_schema():
    assert schema_errors(dashboard()) == []


@pytest.mark.parametrize("breakage", ["panel_key", "gridpos", "no_templating"])
def test_schema_check_catches_a_broken_dashboard(breakage):
    doc = copy.deepcopy(dashboard())
    if breakage == "panel_key":
        doc["panels"][0]["queries"] = doc["panels"][0].pop("targets")
    elif breakage == "gridpos":
        doc["panels"][0]["gridPos"]["w"] = 30
    else:
        del doc["templating"]
    assert schema_errors(doc)


def test_dashboard_is_importable_and_covers_the_fleet():
    doc = dashboard()
    assert doc["uid"] == "onprem-vllm-fleet" and "id" not in doc  # import keeps the uid, assigns its own id
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource", "host", "client"]
    assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in doc["panels"])
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used - exported() == set()
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total", "haproxy_server_status",
                 "onprem_vllm_xid_events_total", "onprem_vllm_usage_tokens_total", "onprem_vllm_usage_budget_used_tokens"):
        assert name in used, name
