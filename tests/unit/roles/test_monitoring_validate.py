# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad monitoring input stops in the role's checks (tasks/validate.yml, the first thing tasks/main.yml runs) with
what to change. Runs the checks through ansible-playbook on this machine (local connection)."""
from __future__ import annotations

import pytest

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


@pytest.fixture
def run_checks(run_playbook):
    """run_checks(host="localhost", **overrides) -> the message that stopped the host, or None."""
    def run(host="localhost", **overrides):
        return run_playbook(PLAYBOOK, dict(GOOD, **overrides), inventory=INVENTORY, host=host).failure()
    return run


def test_good_settings_pass(run_checks):
    assert run_checks() is None


def test_lab_http_sink_passes_with_the_allowance(run_checks):
    assert run_checks(monitoring_alertmanager_webhook_url="http://127.0.0.1:9099/alertmanager",
                      monitoring_alertmanager_webhook_allow_http=True) is None


def test_missing_receiver_is_refused(run_checks):
    message = run_checks(monitoring_alertmanager_webhook_url="")
    assert "no alert receiver: monitoring_alertmanager_webhook_url is empty" in message
    assert "monitoring_alertmanager_enabled: false" in message


def test_no_receiver_needed_without_alertmanager(run_checks):
    assert run_checks(monitoring_alertmanager_webhook_url="", monitoring_alertmanager_enabled=False) is None


@pytest.mark.parametrize("url", ["http://alerts.example.org/hook", "alerts.example.org/hook"])
def test_webhook_that_is_not_https_is_refused(url, run_checks):
    message = run_checks(monitoring_alertmanager_webhook_url=url)
    assert "monitoring_alertmanager_webhook_url must be an https:// URL" in message
    assert "monitoring_alertmanager_webhook_allow_http: true" in message
    assert "example.org" not in message  # the URL may carry a token: only its scheme is shown


@pytest.mark.parametrize("name,value,expect", [
    ("monitoring_alert_kv_cache_usage_threshold", 95, "monitoring_alert_kv_cache_usage_threshold must be in (0, 1]"),
    ("monitoring_alert_server_down_for", "2 minutes", "not Prometheus durations (like 30s, 5m, 2h): monitoring_alert_server_down_for"),
    ("monitoring_alert_xid_severities", ["critical"], "monitoring_alert_xid_severities a non-empty subset of"),
    ("monitoring_alert_hf_cache_free_ratio", 0, "monitoring_alert_hf_cache_free_ratio in (0, 1)"),
])
def test_bad_thresholds_are_refused(name, value, expect, run_checks):
    message = run_checks(**{name: value})
    assert message and expect in message


def test_loopback_exporters_on_a_host_prometheus_does_not_run_on(run_checks):
    settings = {"monitoring_prometheus_host": "localhost", "monitoring_listen_address": "127.0.0.1"}
    assert run_checks(host="localhost", **settings) is None  # Prometheus's own host may stay on loopback
    message = run_checks(host="ws2", **settings)
    assert "this host's exporters would listen on 127.0.0.1 where Prometheus on localhost cannot reach them" in message
