# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan check (playbooks/plan.yml: roles/plan_check with the driver plan and the KV step it wires in) through
ansible-playbook on this machine (local connection), on simulated bare hosts: a PCI sysfs tree (plan_check_sysfs_root)
and a /proc + /sys tree for the driver detection (nvidia_driver_host_root). Each bad input is refused with what to
change, before anything could be installed."""
from __future__ import annotations

import json
import os

import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODELS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "models"))
PLAN_PLAYBOOK = os.path.join(ROOT, "playbooks", "plan.yml")
EXAMPLE = os.path.join(ROOT, "inventories", "example")
PLAYBOOK = """
- name: The plan check under test
  ansible.builtin.import_playbook: %s

- name: Dump the plan
  hosts: vllm_servers
  gather_facts: false
  tasks:
    - name: Dump the plan and the KV plan
      ansible.builtin.debug:
        msg:
          plan_check_result: "{{ plan_check_result | combine({'kv_plan': gpu_preflight_result.kv_plan}) }}"
""" % PLAN_PLAYBOOK
INVENTORY = "[vllm_servers]\nlocalhost ansible_connection=local\n"
RTX4090 = ("0x10de", "0x2684", "0x030000")
RTX3090 = ("0x10de", "0x2204", "0x030000")


@pytest.fixture
def gpu_host(fake_host):
    """gpu_host(gpus=(RTX4090, RTX4090), modules=(), secure_boot=None): a bare host, its GPUs at 0000:01:00.0 on."""
    def make(gpus=(RTX4090, RTX4090), **host):
        return fake_host([("0000:%02x:00.0" % (n + 1), *gpu) for n, gpu in enumerate(gpus)], **host)
    return make


@pytest.fixture
def run_plan(run_playbook, gpu_host):
    """run_plan(host_root=None, **overrides) -> (the refusal or None, plan_check_result)."""
    def run(host_root=None, **overrides):
        host_root = host_root or gpu_host()
        variables = {
            "plan_check_sysfs_root": os.path.join(host_root, "sys"), "nvidia_driver_host_root": host_root,
            "hf_cache_source": "none",
            "gpu_preflight_model_config_path": os.path.join(MODELS, "Qwen3-30B-A3B-FP8", "config.json"),
            "nvidia_driver_branch": "580",
        }
        result = run_playbook(PLAYBOOK, dict(variables, **overrides), inventory=INVENTORY)
        plan = [r["msg"] for r in result.results if "plan_check_result" in r.get("msg", {})]
        return result.failure(), (plan[-1]["plan_check_result"] if plan else None)
    return run


def test_dual_4090_plan_passes_with_the_kv_plan(run_plan):
    msg, plan = run_plan()
    assert msg is None
    assert plan["models"] == ["NVIDIA GeForce RTX 4090"] and int(plan["needed"]) == 2
    assert plan["image_cuda"] == "13.0" and int(plan["min_driver_branch"]) == 580
    assert plan["kv_plan"]["fits"] and int(plan["kv_plan"]["kv_cache_tokens"]) > 32768


def test_fewer_gpus_than_tp_times_pp_is_refused(run_plan, gpu_host):
    msg, dummy = run_plan(gpu_host(gpus=(RTX4090,)))
    assert msg.startswith("Plan check refused localhost (nothing was changed):")
    assert "2 x 1 = 2 GPUs, and the PCI bus shows 1 NVIDIA GPU(s) (0000:01:00.0 NVIDIA GeForce RTX 4090)" in msg
    assert "lower onprem_vllm_tensor_parallel_size" in msg


def test_gpu_too_small_for_the_plan_is_refused(run_plan, gpu_host):
    # Qwen3-30B-A3B in BF16 (~61 GB of weights) on two 24 GB cards: known from the PCI ids, before any driver.
    msg, dummy = run_plan(gpu_host(gpus=(RTX3090, RTX3090)),
                          gpu_preflight_model_config_path=os.path.join(MODELS, "Qwen3-30B-A3B", "config.json"))
    assert msg.startswith("The planned model does not fit on localhost:")
    assert "Suggestions:" in msg


def test_driver_branch_older_than_the_image_needs_is_refused(run_plan):
    msg, dummy = run_plan(nvidia_driver_branch="575")
    assert "The planned driver branch R575 (nvidia_driver_branch) cannot run the image" in msg
    assert 'set nvidia_driver_branch: "580"' in msg and "v0.32.0-cu129" in msg


def test_cu129_image_on_r575_passes(run_plan):
    msg, plan = run_plan(nvidia_driver_branch="575", onprem_vllm_image_tag="v0.32.0-cu129")
    assert msg is None and plan["image_cuda"] == "12.9"


def test_secure_boot_with_an_unsigned_module_path_is_refused(run_plan, gpu_host):
    # Debian (this machine's facts) builds the modules with DKMS: unsigned without an enrolled MOK.
    msg, dummy = run_plan(gpu_host(secure_boot=True), nvidia_driver_source="cuda")
    assert "Secure Boot is enabled and this install path builds unsigned kernel modules (DKMS)" in msg
    assert "mokutil --import" in msg


def test_nouveau_loaded_with_no_reboot_allowed_is_refused(run_plan, gpu_host):
    msg, dummy = run_plan(gpu_host(modules=("nouveau",)))
    assert "nouveau is loaded and holds the GPUs" in msg
    assert "never reboots a connection: local host" in msg


def test_several_refusals_come_in_one_message(run_plan, gpu_host):
    msg, dummy = run_plan(gpu_host(gpus=(RTX4090,), modules=("nouveau",)),
                          nvidia_driver_branch="570")
    assert "(1) " in msg and "(2) " in msg and "(3) " in msg


def test_unpinned_image_is_refused(run_plan):
    msg, dummy = run_plan(onprem_vllm_image_tag="latest")
    assert "onprem_vllm_image_tag must pin a release: pin a tag like v0.32.0 (got 'latest'" in msg


def test_bad_numbers_are_refused_by_the_plan_check(run_plan):
    """The plan check uses the same settings check as vllm_server (module_utils/vllm_settings.py), naming the plan."""
    msg, dummy = run_plan(onprem_vllm_max_model_len=0, onprem_vllm_max_num_batched_tokens=-1,
                          onprem_vllm_tensor_parallel_size=0, onprem_vllm_served_model_name="qwen 3")
    for expected in ("onprem_vllm_max_model_len must be a whole number >= 1 (got 0)",
                     "onprem_vllm_max_num_batched_tokens must be a whole number >= 1 (got -1)",
                     "onprem_vllm_tensor_parallel_size must be a whole number >= 1 (got 0)",
                     "onprem_vllm_served_model_name must be a non-empty name without spaces"):
        assert expected in msg


def test_empty_model_pin_is_refused(run_plan):
    msg, dummy = run_plan(onprem_vllm_model_revision="")
    assert "pin hf_cache_revision to a 40-hex commit or a branch/tag name" in msg


def test_unknown_gpu_needs_a_declaration_then_passes(run_plan, gpu_host):
    h100_nvl = ("0x10de", "0x2321", "0x030200")
    host_root = gpu_host(gpus=(h100_nvl, h100_nvl))
    msg, dummy = run_plan(host_root)
    assert "which this collection's table does not know: declare each in plan_check_gpu_models" in msg
    msg, plan = run_plan(host_root,
                         plan_check_gpu_models={"0x2321": {"name": "NVIDIA H100 NVL", "memory_mib": 95830}})
    assert msg is None and plan["models"] == ["NVIDIA H100 NVL"]


def test_lab_cpu_mode_skips_the_gpu_steps(run_plan, gpu_host):
    msg, plan = run_plan(gpu_host(gpus=()), onprem_vllm_cpu_mode=True,
                         onprem_vllm_tensor_parallel_size=1, onprem_vllm_max_model_len=2048,
                         onprem_vllm_max_num_batched_tokens=2048, onprem_vllm_max_num_seqs=16,
                         onprem_vllm_cpu_kv_cache_space_gib=1,
                         gpu_preflight_model_config_path=os.path.join(MODELS, "tiny-qwen3", "config.json"))
    assert msg is None and plan["cpu_mode"] and plan["kv_plan"]["fits"]


def test_a_missing_served_name_is_named(run_plan):
    msg, dummy = run_plan(onprem_vllm_served_model_name="<unset>")
    assert "onprem_vllm_served_model_name must be a non-empty name without spaces" in msg


def test_a_missing_port_is_named(run_plan):
    msg, dummy = run_plan(onprem_vllm_port="<unset>")
    assert "argument 'onprem_vllm_port' is of type NoneType" in msg


EXAMPLE_DUMP = """
- name: The plan check under test
  ansible.builtin.import_playbook: %s

- name: Dump each deployment's KV plan
  hosts: vllm_servers
  gather_facts: false
  tasks:
    - name: Dump
      ansible.builtin.debug:
        msg:
          kv_plans: "{{ _onprem_kv_plans }}"
""" % PLAN_PLAYBOOK


@pytest.mark.parametrize("group, gpus, here, placed", [
    # ws-01 of the example: the chat model on both GPUs, the router and the embedding model each sharing one.
    ("vllm_rag", 2, ["chat", "embed", "router"], "chat, router, embed (ports 8000, 8001, 8002)"),
    # ws-04: four GPUs, chat on two and the vision-language model (tensor parallel 2) on the other two.
    ("vllm_vision", 4, ["chat", "vision"], "chat, vision (ports 8000, 8003)"),
])
def test_the_example_inventory_plans_on_the_rtx_4090_hosts_it_describes(
        run_playbook, gpu_host, tmp_path, hf_hub_double, group, gpus, here, placed):
    """inventories/example as an operator copies it (its group_vars as they are, its hosts replaced by this machine)
    passes the plan check on a bare RTX 4090 workstation of each kind it describes. Nothing of conftest's PLAN goes in (plan=False): the
    plan and the role settings are the example's own. The host has staged nothing, so each deployment's model is read
    from the hub on the controller: here conftest's hub TEST DOUBLE (hf_cache_hub_endpoint, the one setting changed)
    holding the three models' config.json (the fixtures; weights not listed). Its Vault placeholders go in as they are:
    the hub token placeholder is what the double is sent."""
    with open(os.path.join(EXAMPLE, "group_vars", "all", "plan.yml")) as handle:
        plan = yaml.safe_load(handle)
    inventory = tmp_path / "example"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(os.path.join(EXAMPLE, "group_vars"))
    (inventory / "hosts.ini").write_text(INVENTORY + "[%s]\nlocalhost\n" % group)
    models = {d.get("model", plan["onprem_vllm_model"]) for d in plan["onprem_vllm_deployments"]}
    repos = {}
    for number, model in enumerate(sorted(models)):
        with open(os.path.join(MODELS, model.split("/")[1], "config.json")) as handle:
            repos[model] = {"sha": "%040x" % (number + 1), "files": {"config.json": json.load(handle)}}
    hub_endpoint, tokens_seen = hf_hub_double(repos)
    host_root = gpu_host(gpus=(RTX4090,) * gpus)
    result = run_playbook(EXAMPLE_DUMP, {
        "plan_check_sysfs_root": os.path.join(host_root, "sys"),  # the simulated host's PCI bus: this one has no GPUs
        "nvidia_driver_host_root": host_root,  # its /proc and /sys: no driver loaded, no nouveau, no Secure Boot
        "hf_cache_hub_endpoint": hub_endpoint,
    }, inventory=inventory, plan=False)
    assert result.failure() is None and result.rc == 0, result.failure()
    checked = [r for r in result.results if "plan_check_result" in r.get("ansible_facts", {})][-1]
    checked = checked["ansible_facts"]["plan_check_result"]
    assert checked["models"] == ["NVIDIA GeForce RTX 4090"] and len(checked["gpus"]) == gpus
    assert checked["driver_action"] == "install"  # a bare host: no driver yet
    kv_plans = [r["msg"]["kv_plans"] for r in result.results if "kv_plans" in r.get("msg", {})][-1]
    deployments = {d["name"]: d for d in plan["onprem_vllm_deployments"]}
    assert sorted(kv_plans) == here
    for name, kv_plan in kv_plans.items():
        wanted = deployments[name]
        assert kv_plan["fits"], (name, kv_plan)
        assert kv_plan["gpu_memory_utilization"] == wanted.get("gpu_memory_utilization",
                                                               plan["onprem_vllm_gpu_memory_utilization"])
        max_model_len = wanted.get("max_model_len", plan["onprem_vllm_max_model_len"])
        assert kv_plan["max_model_len"] == max_model_len
        assert int(kv_plan["kv_cache_tokens"]) > max_model_len, (name, kv_plan)
    # The chat deployment's own fraction, not the fleet-wide default it overrides.
    assert deployments["chat"]["gpu_memory_utilization"] != plan["onprem_vllm_gpu_memory_utilization"]
    # Each model read from the hub, with the example's token (its Vault placeholder here).
    assert set(tokens_seen) == {"Bearer REPLACE WITH ansible-vault encrypt_string"}
    assert len(tokens_seen) >= 2 * len(here)
    assert [r["msg"] for r in result.results if str(r.get("msg", "")).startswith("localhost serves")] == [
        "localhost serves " + placed]


@pytest.mark.parametrize("accepted, extra, refused", [
    ("old-key-0123456789abcdef\n", {}, True),  # the gateway would send a key the server refuses
    ("new-key-0123456789abcdef\nold-key-0123456789abcdef\n", {}, False),  # step 1 of a rotation done
    ("old-key-0123456789abcdef\n", {"onprem_vllm_api_key_switch_at_once": True}, False),
    (None, {}, False),  # no server yet
])
def test_a_key_the_running_server_does_not_accept_is_refused(run_plan, tmp_path, accepted, extra, refused):
    key_file = tmp_path / "vllm.api-key"
    if accepted is not None:
        key_file.write_text(accepted)
    msg, dummy = run_plan(onprem_vllm_api_key="new-key-0123456789abcdef", plan_check_server_key_file=str(key_file),
                          **extra)
    if refused:
        assert "onprem_vllm_api_key is not a key its running server accepts" in msg
        assert "set onprem_vllm_api_key_rotation to the new one" in msg and "0123456789abcdef" not in msg
    else:
        assert msg is None
