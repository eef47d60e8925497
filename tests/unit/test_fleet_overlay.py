# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet scenario runs inventories/example: its group_vars are the example's files (links), its secrets carry the
example's Vault names, and the one lab overlay on top holds only the keys allowed below, each for a reason that
cannot exist on this machine. A key added to the overlay fails here until it is listed with its reason: a setting the
lab overrides is a setting the scenario does not test."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "inventories", "example", "group_vars")
FLEET = os.path.join(ROOT, "molecule", "fleet")
OVERLAY = os.path.join(FLEET, "lab_overlay.yml")

# Why each key may differ from the example. Nothing else may: not TLS, not a bind or advertise address, not a key.
ALLOWED = {
    "ansible_python_interpreter": "the lab image's Python is known (no discovery round trip)",
    "onprem_vllm_cpu_mode": "no GPU",
    "onprem_vllm_cpu_kv_cache_space_gib": "no GPU",
    "onprem_vllm_model": "tiny model",
    "onprem_vllm_model_revision": "tiny model",
    "onprem_vllm_tensor_parallel_size": "no GPU",
    "onprem_vllm_max_model_len": "tiny model",
    "onprem_vllm_max_num_batched_tokens": "tiny model",
    "onprem_vllm_max_num_seqs": "tiny model",
    "onprem_vllm_enforce_eager": "no GPU (torch.compile on 2 cores)",
    "vllm_server_env": "no GPU (vLLM's CPU threads)",
    "onprem_vllm_deployment_overrides": "tiny model (the deployments' model and context; one CPU worker for a "
                                        "deployment whose tensor parallel size the example sets)",
    "docker_engine_source": "archive delivery (no Docker repository)",
    "hf_cache_source": "archive delivery (no hub)",
    "hf_cache_archive": "archive delivery",
    "hf_cache_archive_remote_src": "archive delivery",
    "vllm_server_image_archive": "archive delivery (no registry)",
    "vllm_server_image_load_throttle": "archive delivery on one shared disk",
    "gateway_image": "no registry (the lab's own HAProxy image, lab/build_gateway_image.py)",
    "gateway_image_tag": "no registry (the lab's own HAProxy image, lab/build_gateway_image.py)",
    "gateway_image_digest": "archive delivery (the lab's own image has no registry digest)",
    "gateway_image_archive": "archive delivery",
    "vllm_server_healthcheck_start_period": "2 cores starting CPU vLLM under load",
    "vllm_server_gate_timeout": "2 cores starting CPU vLLM under load",
    "monitoring_node_exporter_fs_types_exclude": "test double: a container's overlay root filesystem",
    "monitoring_alertmanager_webhook_allow_http": "test double: a plain-HTTP webhook sink on loopback",
    "monitoring_prometheus_scrape_interval": "test timing",
    "monitoring_alert_server_down_for": "test timing",
    "monitoring_alert_gateway_out_of_rotation_for": "test timing",
    "monitoring_alertmanager_group_wait": "test timing",
    "monitoring_alertmanager_group_interval": "test timing",
    "monitoring_alertmanager_repeat_interval": "test timing",
    "monitoring_xid_log_files": "test double: a replayed kernel log",
    "vllm_server_extra_args": "test double: a flag vLLM refuses, for the broken-host rollout",
}


def load(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def vault_keys(path):
    """Top-level keys of a vars file whose values may be !vault (safe_load does not know the tag)."""
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_constructor("!vault", lambda loader, node: "<vault>")
    with open(path) as handle:
        return set(yaml.load(handle, Loader=Loader) or {})  # noqa: S506 (SafeLoader subclass)


def test_the_overlay_holds_only_allowed_keys():
    extra = sorted(set(load(OVERLAY)) - set(ALLOWED))
    assert not extra, f"keys in {OVERLAY} not on the allow-list (add them with a reason only if they cannot exist here): {extra}"


def test_each_overlay_key_has_a_reason_line_above_it():
    lines = open(OVERLAY).read().splitlines()
    keys = load(OVERLAY)
    key_lines = tuple(key + ":" for key in keys)
    for key in keys:
        index = next(n for n, line in enumerate(lines) if line.startswith(key + ":"))
        above = lines[:index]
        while above and (above[-1].startswith(key_lines) or above[-1].startswith("  ")):
            above.pop()  # a key of the same reason group, or a value's continuation
        assert above and above[-1].startswith("#"), f"{key} has no reason comment above it (or above its group)"


@pytest.mark.parametrize("relative", ["all/plan.yml", "all/rollout.yml", "vllm_servers/main.yml", "vllm_gateways/main.yml"])
def test_the_scenario_group_vars_are_the_examples_files(relative):
    link = os.path.join(FLEET, "group_vars", relative)
    assert os.path.islink(link) and os.path.realpath(link) == os.path.realpath(os.path.join(EXAMPLE, relative))


def test_every_example_group_vars_file_is_linked_or_replaced_by_the_labs_secrets():
    for group in os.listdir(EXAMPLE):
        for name in os.listdir(os.path.join(EXAMPLE, group)):
            assert os.path.exists(os.path.join(FLEET, "group_vars", group, name)), f"{group}/{name} is not in the scenario"


@pytest.mark.parametrize("relative", ["all/vault.yml", "vllm_gateways/vault.yml"])
def test_the_labs_secrets_carry_the_examples_vault_names(relative):
    lab = os.path.join(FLEET, "group_vars", relative)
    assert not os.path.islink(lab)
    assert vault_keys(lab) == set(load(os.path.join(EXAMPLE, relative)))
    assert all(line.startswith(("#", "---", " ")) or ": !vault |" in line for line in open(lab).read().splitlines()), \
        "every lab secret is Vault-encrypted"


def test_every_host_is_in_the_overlay_group_which_sorts_last():
    """Ansible merges groups of one depth by name, the last winning: the overlay's group must sort after every other
    group of each host, and its group_vars must be the overlay."""
    scenario = load(os.path.join(FLEET, "molecule.yml"))
    assert scenario["provisioner"]["inventory"]["links"]["group_vars"] == "group_vars/"
    for platform in scenario["platforms"]:
        assert "zz_lab_overlay" in platform["groups"], platform["name"]
        assert max(platform["groups"]) == "zz_lab_overlay", platform["name"]
    link = os.path.join(FLEET, "group_vars", "zz_lab_overlay.yml")
    assert os.path.realpath(link) == os.path.realpath(OVERLAY)


def test_the_overlay_wins_over_the_examples_group_vars(tmp_path):
    """Resolved by Ansible on the inventory molecule generates: the overlay's docker_engine_source beats the example's
    (group_vars/vllm_servers and vllm_gateways), and the example's own settings (TLS, the exporter's address) stay."""
    scenario = load(os.path.join(FLEET, "molecule.yml"))
    inventory = {"all": {"hosts": {p["name"]: {} for p in scenario["platforms"]}}}
    for platform in scenario["platforms"]:
        for group in platform["groups"]:
            inventory.setdefault(group, {"hosts": {}})["hosts"][platform["name"]] = {}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    os.symlink(os.path.join(FLEET, "group_vars"), tmp_path / "group_vars")
    os.symlink(os.path.join(FLEET, "host_vars"), tmp_path / "host_vars")
    listing = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-inventory"), "-i", str(tmp_path / "inventory.yml"),
         "--list"], cwd=ROOT, capture_output=True, text=True, check=True)
    hostvars = json.loads(listing.stdout)["_meta"]["hostvars"]
    example_servers = load(os.path.join(EXAMPLE, "vllm_servers", "main.yml"))
    example_gateways = load(os.path.join(EXAMPLE, "vllm_gateways", "main.yml"))
    for name, host in hostvars.items():
        assert host["docker_engine_source"] == load(OVERLAY)["docker_engine_source"] != example_servers["docker_engine_source"]
        assert host["onprem_vllm_cpu_mode"] is True
    gateway = hostvars["fleet-gw"]
    for key in ("gateway_tls_certificate", "gateway_tls_key", "gateway_metrics_bind_address", "gateway_port"):
        assert gateway[key] == example_gateways[key], key


def test_the_overlay_changes_only_the_model_and_context_of_the_example_deployments():
    """And the tensor parallel size, only to 1 (CPU mode: one worker), only where the example sets its own."""
    example = {d["name"]: d for d in load(os.path.join(EXAMPLE, "all", "plan.yml"))["onprem_vllm_deployments"]}
    overrides = load(OVERLAY)["onprem_vllm_deployment_overrides"]
    assert set(overrides) <= set(example), "the overlay adjusts a deployment the example does not have"
    for name, settings in overrides.items():
        assert set(settings) <= {"model", "model_revision", "max_model_len", "tensor_parallel_size"}, \
            (name, sorted(settings))
        if "tensor_parallel_size" in settings:
            assert settings["tensor_parallel_size"] == 1 and "tensor_parallel_size" in example[name], name
