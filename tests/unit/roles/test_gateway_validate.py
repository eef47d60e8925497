# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's client keys and grants: checked before anything changes, and a client's rotation key served under its
name.

Runs the role's checks (tasks/validate.yml) and renders its clients map through ansible-playbook on this machine (local
connection, nothing written): every case in one run, each case a host of its own.
"""
from __future__ import annotations

import hashlib
import os

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

PLAYBOOK = """
- name: gateway checks under test
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the checks
      ansible.builtin.include_role:
        name: gateway
        tasks_from: validate.yml
        public: true

    - name: Show the usage service's settings
      ansible.builtin.debug:
        msg: "{{ _gateway_usage_settings }}"

    - name: Show the forwarded paths
      ansible.builtin.debug:
        msg: "{{ gateway_forwarded_paths }}"

    - name: Render the clients map
      ansible.builtin.debug:
        msg: "{{ lookup('ansible.builtin.template', '%s') }}"
""" % os.path.join(ROOT, "roles", "gateway", "templates", "clients.map.j2")
IDE, IDE_NEXT, BATCH = "ide-key-0123456789abcdef", "ide-next-0123456789abcdef", "batch-key-0123456789abcdef"
BASE = {"gateway_image_tag": "3.2-lab", "gateway_backend_api_key": "server-key-0123456789abcdef",
        "gateway_backend_tls": False,
        "gateway_backends": [{"name": "chat", "runner": "generate", "served_names": ["tiny-chat", "chat-alias"],
                              "servers": [{"name": "ws1", "address": "10.0.0.11", "port": 8000}]},
                             {"name": "embed", "runner": "pooling", "served_names": ["tiny-embed"],
                              "servers": [{"name": "ws2", "address": "10.0.0.12", "port": 8001}]}]}
CASES = {
    # Mutual TLS to servers whose certificates no play published (they are not even in the inventory).
    "tls_without_server_certificates": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                                        "gateway_backend_tls": True},
    "rotating": {"gateway_client_keys": [{"name": "ide", "key": IDE, "rotation_key": IDE_NEXT},
                                         {"name": "batch", "key": BATCH}]},
    "short_rotation_key": {"gateway_client_keys": [{"name": "ide", "key": IDE, "rotation_key": "short"}]},
    "key_of_two_clients": {"gateway_client_keys": [{"name": "ide", "key": IDE},
                                                   {"name": "batch", "key": BATCH, "rotation_key": IDE}]},
    "undefined_vault_key": {"gateway_client_keys": [{"name": "ide", "key": "{{ vault_gateway_key_missing }}"}]},
    "granted_alias": {"gateway_client_keys": [{"name": "ide", "key": IDE, "models": ["chat-alias"]}]},
    "model_not_served": {"gateway_client_keys": [{"name": "ide", "key": IDE, "models": ["tiny-chat", "tiny-rerank"]}]},
    "unsafe_client_name": {"gateway_client_keys": [{"name": "ide team", "key": IDE}]},
    "no_backend": {"gateway_client_keys": [{"name": "ide", "key": IDE}], "gateway_backends": []},
    "chat_only": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                  "gateway_backends": BASE["gateway_backends"][:1]},
    "limited": {"gateway_client_keys": [{"name": "ide", "key": IDE, "requests_per_second": 5,
                                         "max_concurrent_requests": 4, "max_body_bytes": 65536}]},
    "limit_as_text": {"gateway_client_keys": [{"name": "ide", "key": IDE, "requests_per_second": "5/s"}]},
    "limit_zero": {"gateway_client_keys": [{"name": "ide", "key": IDE, "max_concurrent_requests": 0}]},
    "limit_boolean": {"gateway_client_keys": [{"name": "ide", "key": IDE, "max_body_bytes": True}]},
    "body_timeout_words": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                           "gateway_timeout_request_body": "ten seconds"},
    "finder_body_within_buffer": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                                  "gateway_model_finder_max_body_bytes": 65536},
    "finder_no_requests": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                           "gateway_model_finder_max_requests": 0},
    "per_source_over_maxconn": {"gateway_client_keys": [{"name": "ide", "key": IDE}],
                                "gateway_max_connections_per_source": 5000},
    # playbooks/gateway.yml alone (no plan check before it): the embeddings deployment also answers to chat's alias.
    "alias_of_two_deployments": {"gateway_client_keys": [{"name": "ide", "key": IDE, "models": ["tiny-embed"]}],
                                 "gateway_backends": [BASE["gateway_backends"][0],
                                                      dict(BASE["gateway_backends"][1],
                                                           served_names=["tiny-embed", "chat-alias"])]},
    "budgets": {"gateway_client_keys": [
        {"name": "ide", "key": IDE},
        {"name": "batch", "key": BATCH, "token_budgets": [{"tokens": 200000000, "period": "30d"},
                                                          {"tokens": 5000, "period": "day", "models": ["chat-alias"]}]}]},
    "budget_period_words": {"gateway_client_keys": [{"name": "ide", "key": IDE, "token_budgets": [
        {"tokens": 1000, "period": "fortnight"}]}]},
    "budget_tokens_zero": {"gateway_client_keys": [{"name": "ide", "key": IDE, "token_budgets": [
        {"tokens": 0, "period": "day"}]}]},
    "budget_unknown_key": {"gateway_client_keys": [{"name": "ide", "key": IDE, "token_budgets": [
        {"tokens": 10, "period": "day", "per": "model"}]}]},
    "budget_model_not_served": {"gateway_client_keys": [{"name": "ide", "key": IDE, "token_budgets": [
        {"tokens": 10, "period": "week", "models": ["tiny-rerank"]}]}]},
    "client_named_direct": {"gateway_client_keys": [{"name": "direct", "key": IDE}]},
    "budget_not_a_list": {"gateway_client_keys": [{"name": "ide", "key": IDE, "token_budgets": {"tokens": 10}}]},
}
MESSAGES = {
    "short_rotation_key": "a client's rotation_key in gateway_client_keys must be 16+ such characters too",
    "key_of_two_clients": "gateway_client_keys gives one key twice (no key given to two clients",
    "undefined_vault_key": "does not resolve (a vault_* variable is undefined",
    "model_not_served": "gateway_client_keys: client ide's models name tiny-rerank, which no deployment of the gateway "
                        "serves (it serves tiny-chat, chat-alias, tiny-embed)",
    "unsafe_client_name": "gateway_client_keys: client name(s) ide team must be letters, digits and ._-",
    "no_backend": "gateway_backends is empty: no deployment has a host in the group vllm_servers",
    "limit_as_text": "gateway_client_keys: client ide's requests_per_second must be a whole number of at least 1",
    "limit_zero": "gateway_client_keys: client ide's max_concurrent_requests must be a whole number of at least 1",
    "limit_boolean": "gateway_client_keys: client ide's max_body_bytes must be a whole number of at least 1",
    "body_timeout_words": "gateway_timeout_http_request and gateway_timeout_request_body must be HAProxy times",
    "finder_body_within_buffer": "gateway_model_finder_max_body_bytes a number of bytes above "
                                 "gateway_request_buffer_size",
    "finder_no_requests": "gateway_model_finder_max_requests must be a whole number of at least 1",
    "per_source_over_maxconn": "gateway_max_connections_per_source must be a whole number from 0 (no bound) to "
                               "gateway_maxconn",
    "alias_of_two_deployments": "gateway_backends: the served name or alias chat-alias belongs to deployments chat and "
                                "embed: a request for it reaches only one of them",
    "budget_period_words": "gateway_client_keys: client ide's token_budgets entry 1 must be {tokens: a whole number of "
                           "at least 1, period: day, week, month or Nd",
    "budget_tokens_zero": "gateway_client_keys: client ide's token_budgets entry 1 must be {tokens",
    "budget_unknown_key": "gateway_client_keys: client ide's token_budgets entry 1 must be {tokens",
    "budget_model_not_served": "gateway_client_keys: client ide's token_budgets entry 1 models must be a non-empty list "
                               "of names the gateway serves (tiny-chat, chat-alias, tiny-embed)",
    "budget_not_a_list": "gateway_client_keys: client ide's token_budgets must be a list of {tokens, period, models",
    "client_named_direct": "gateway_client_keys: the client name direct is the servers' name for requests that did "
                           "not come through a gateway",
    "tls_without_server_certificates": "gateway_backend_tls is on, but no certificate of server(s) ws1, ws2 is known "
                                       "to pin (vllm_server_tls_certificate)",
}


def _sha256(key):
    return hashlib.sha256(key.encode()).hexdigest().upper()


@pytest.fixture(scope="module")
def runs(playbook_cases, tmp_path_factory):
    return playbook_cases(PLAYBOOK, {case: dict(BASE, **extra) for case, extra in CASES.items()},
                          str(tmp_path_factory.mktemp("gateway-checks")))


def test_both_keys_of_a_rotating_client_map_to_its_name(runs):
    run = runs["rotating"]
    assert run.failure() is None, run.failure()
    lines = [line for line in run.results[-1]["msg"].splitlines() if not line.startswith("#")]
    # The map holds each key's SHA-256 (upper-case hex, as HAProxy's digest(sha256),hex writes it), never the key.
    assert lines == [f"{_sha256(IDE)} ide", f"{_sha256(IDE_NEXT)} ide", f"{_sha256(BATCH)} batch"]
    assert not any(key in run.results[-1]["msg"] for key in (IDE, IDE_NEXT, BATCH))


@pytest.mark.parametrize("case", MESSAGES)
def test_a_bad_setting_stops_before_anything_changes_naming_it(runs, case):
    message = runs[case].failure()
    assert message and MESSAGES[case] in message
    assert IDE not in message and IDE_NEXT not in message  # the message names settings, never keys


def test_a_client_may_be_granted_a_model_by_an_alias(runs):
    assert runs["granted_alias"].failure() is None, runs["granted_alias"].failure()


@pytest.mark.parametrize("case, paths", [
    ("rotating", ["/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v2/embed",
                  "/v1/rerank", "/rerank", "/v2/rerank", "/score", "/v1/score"]),
    ("chat_only", ["/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses"])])
def test_the_pooling_paths_are_open_only_with_a_pooling_deployment(runs, case, paths):
    assert runs[case].results[-2]["msg"] == paths


def test_a_client_with_limits_passes_the_checks(runs):
    assert runs["limited"].failure() is None, runs["limited"].failure()


def test_budgets_pass_the_checks_and_reach_the_usage_service_without_any_client_key(runs):
    run = runs["budgets"]
    assert run.failure() is None, run.failure()
    settings = run.results[-3]["msg"]
    assert settings["clients"] == [
        {"name": "ide", "token_budgets": []},
        {"name": "batch", "token_budgets": [
            {"tokens": 200000000, "period": "30d"}, {"tokens": 5000, "period": "day", "models": ["chat-alias"]}]}]
    assert settings["backends"] == [{"name": "chat", "served_names": ["tiny-chat", "chat-alias"]},
                                    {"name": "embed", "served_names": ["tiny-embed"]}]
    assert settings["servers"] == [{"name": "vllm-chat/ws1", "url": "http://10.0.0.11:8000"},
                                   {"name": "vllm-embed/ws2", "url": "http://10.0.0.12:8001"}]
    assert settings["key"] == BASE["gateway_backend_api_key"]
    assert IDE not in str(settings) and BATCH not in str(settings)
