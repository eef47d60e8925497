# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad monitoring input stops in the role's checks (tasks/validate.yml, the first thing tasks/main.yml runs) with
what to change. Runs the checks through ansible-playbook on this machine (local connection)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = """
- name: monitoring checks under test
  hosts: vllm_servers
  gather_facts: false
  tasks:
    - name: Run the checks
      ansible.builtin.include_role:
        name: onprem.vllm.monitoring
        tasks_from: validate
"""
INVENTORY = "[vllm_servers]\nlocalhost ansible_connection=local\nws2 ansible_connection=local\n"
GOOD = {"monitoring_alertmanager_webhook_url": "https://alerts.example.org/hook/T0K3N"}


def run_checks(tmp_path, host="localhost", **overrides):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.ini").write_text(INVENTORY)
    variables = dict(GOOD, ansible_python_interpreter=sys.executable)
    variables.update(overrides)
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    playbook_bin = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook_bin, "-i", str(tmp_path / "hosts.ini"), "-e", json.dumps(variables),
                           str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    results = [task["hosts"][host] for task in json.loads(proc.stdout)["plays"][0]["tasks"] if host in task["hosts"]]
    failed = [r for r in results if r.get("failed")]
    return failed[-1]["msg"] if failed else None


def test_good_settings_pass(tmp_path):
    assert run_checks(tmp_path) is None


def test_lab_http_sink_passes_with_the_allowance(tmp_path):
    assert run_checks(tmp_path, monitoring_alertmanager_webhook_url="http://127.0.0.1:9099/alertmanager",
                      monitoring_alertmanager_webhook_allow_http=True) is None


def test_missing_receiver_is_refused(tmp_path):
    message = run_checks(tmp_path, monitoring_alertmanager_webhook_url="")
    assert "no alert receiver: monitoring_alertmanager_webhook_url is empty" in message
    assert "monitoring_alertmanager_enabled: false" in message


def test_no_receiver_needed_without_alertmanager(tmp_path):
    assert run_checks(tmp_path, monitoring_alertmanager_webhook_url="", monitoring_alertmanager_enabled=False) is None


@pytest.mark.parametrize("url", ["http://alerts.example.org/hook", "alerts.example.org/hook"])
def test_webhook_that_is_not_https_is_refused(tmp_path, url):
    message = run_checks(tmp_path, monitoring_alertmanager_webhook_url=url)
    assert "monitoring_alertmanager_webhook_url must be an https:// URL" in message
    assert "monitoring_alertmanager_webhook_allow_http: true" in message
    assert "example.org" not in message  # the URL may carry a token: only its scheme is shown


@pytest.mark.parametrize("name,value,expect", [
    ("monitoring_alert_kv_cache_usage_threshold", 95, "monitoring_alert_kv_cache_usage_threshold must be in (0, 1]"),
    ("monitoring_alert_server_down_for", "2 minutes", "not Prometheus durations (like 30s, 5m, 2h): monitoring_alert_server_down_for"),
    ("monitoring_alert_xid_severities", ["critical"], "monitoring_alert_xid_severities a non-empty subset of"),
    ("monitoring_alert_hf_cache_free_ratio", 0, "monitoring_alert_hf_cache_free_ratio in (0, 1)"),
])
def test_bad_thresholds_are_refused(tmp_path, name, value, expect):
    message = run_checks(tmp_path, **{name: value})
    assert message and expect in message


def test_loopback_exporters_on_a_host_prometheus_does_not_run_on(tmp_path):
    settings = {"monitoring_prometheus_host": "localhost", "monitoring_listen_address": "127.0.0.1"}
    assert run_checks(tmp_path, host="localhost", **settings) is None  # Prometheus's own host may stay on loopback
    message = run_checks(tmp_path, host="ws2", **settings)
    assert "this host's exporters would listen on 127.0.0.1 where Prometheus on localhost cannot reach them" in message
