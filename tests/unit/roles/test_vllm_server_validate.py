# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input to vllm_server stops in its checks, before the running server is touched, with what to change.

Runs the role's check steps (tasks/validate.yml, tasks/image.yml) through ansible-playbook against this machine's
real Docker engine (local connection).
"""
from __future__ import annotations

import json
import socket

import pytest

PLAYBOOK = """
- name: vllm_server checks under test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the checks
      ansible.builtin.include_role:
        name: vllm_server
        tasks_from: "{{ item }}"
      loop: {steps}
"""
BASE = {  # a valid lab-like plan; each test breaks one thing
    "vllm_server_cpu_mode": True, "vllm_server_model": "onprem-lab/tiny-qwen3", "vllm_server_model_revision": "",
    "vllm_server_served_model_name": "qwen3-lab", "vllm_server_tensor_parallel_size": 1,
    "vllm_server_container_name": "onprem-test-vllm-absent", "vllm_server_image_tag": "v0.32.0",
    "vllm_server_image": "onprem-test/not-an-image",
}


pytestmark = pytest.mark.needs_docker


@pytest.fixture
def run_checks(run_playbook, tmp_path, free_port):
    """run_checks(steps=("validate.yml", "image.yml"), **overrides) -> the message that stopped the play, or None."""
    def run(steps=("validate.yml", "image.yml"), **overrides):
        variables = dict(BASE, vllm_server_port=free_port(), vllm_server_hf_cache_path=str(tmp_path / "hf"),
                         vllm_server_image_archive=str(tmp_path / "a.tar"))
        return run_playbook(PLAYBOOK.replace("{steps}", json.dumps(list(steps))), dict(variables, **overrides)).failure()
    return run


def test_unpinned_tag_is_refused(run_checks):
    assert "must pin a release: pin a tag like v0.32.0 (got 'latest'" in run_checks(vllm_server_image_tag="latest")


def test_bad_numbers_and_names_are_refused_at_once(run_checks):
    """The role's validate step uses the one settings check (module_utils/vllm_settings.py): every message at once."""
    message = run_checks(steps=("validate.yml",), vllm_server_max_model_len=-5, vllm_server_max_num_seqs=0,
                         vllm_server_served_model_name="", vllm_server_gpu_memory_utilization=1.5,
                         vllm_server_model="/models/x", vllm_server_port=70000)
    for expected in ("vllm_server_max_model_len must be a whole number >= 1 (got -5)",
                     "vllm_server_max_num_seqs must be a whole number >= 1 (got 0)",
                     "vllm_server_served_model_name must be a non-empty name without spaces",
                     "vllm_server_gpu_memory_utilization must be a fraction in (0, 1]",
                     "vllm_server_model is the path '/models/x', which the server's container does not have",
                     "vllm_server_port must be a TCP port 1..65535 (got 70000)"):
        assert expected in message


def test_open_port_without_api_key_is_refused(run_checks):
    message = run_checks(vllm_server_bind_address="0.0.0.0", vllm_server_api_key="")
    assert "exposes the server beyond this host: set vllm_server_api_key (from Vault) or bind to 127.0.0.1" in message


def test_api_key_with_whitespace_is_refused(run_checks):
    message = run_checks(vllm_server_api_key="REPLACE WITH ansible-vault encrypt_string")
    assert "vllm_server_api_key must be one string without spaces or newlines" in message


def test_tensor_parallel_larger_than_the_gpus_assigned(run_checks):
    message = run_checks(vllm_server_cpu_mode=False, vllm_server_tensor_parallel_size=2,
                         vllm_server_gpu_uuids=["GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"])
    assert "tensor_parallel_size x pipeline_parallel_size = 2 GPUs, but 1 are assigned" in message


@pytest.mark.parametrize("extra, flag", [(["--api-key", "sec-value"], "--api-key"), (["--api_key", "sec-value"], "--api_key"),
                                         (["--api_key=sec-value"], "--api_key")])
def test_api_key_on_the_command_line_is_refused(extra, flag, run_checks):
    message = run_checks(vllm_server_extra_args=extra)
    assert f"vllm_server_extra_args carries the API key flag ({flag})" in message and "sec-value" not in message


def test_api_key_in_the_environment_is_refused(run_checks):
    message = run_checks(vllm_server_env={"VLLM_API_KEY": "sec-value"})
    assert "vllm_server_env sets VLLM_API_KEY" in message and "sec-value" not in message


def test_port_in_use_is_refused(run_checks):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = run_checks(vllm_server_port=port)
    assert f"Port {port} on localhost is in use by something other than the onprem-test-vllm-absent container" in message


def test_revision_missing_from_the_offline_cache_is_refused(run_checks):
    message = run_checks(vllm_server_model_revision="d77141a471636dda364651d872c8e1075b8947d5")
    assert "Revision d77141a471636dda364651d872c8e1075b8947d5 of onprem-lab/tiny-qwen3 is not in the cache" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_image_missing_and_no_archive_is_refused(run_checks):
    message = run_checks()
    assert "Image onprem-test/not-an-image:v0.32.0 is not on localhost and the archive" in message


def test_a_valid_plan_passes_the_checks_until_the_image(run_checks):
    # Everything before the image is fine: the only refusal is the (deliberately) missing image.
    message = run_checks(vllm_server_bind_address="0.0.0.0", vllm_server_api_key="lab-0123456789abcdef")
    assert message.startswith("Image onprem-test/not-an-image:v0.32.0 is not on localhost")


def test_archive_without_room_to_load_is_refused(tmp_path, run_checks):
    # A sparse file: it claims 8 TiB and takes no space, so no disk here has twice that free.
    archive = tmp_path / "huge.tar"
    with archive.open("wb") as handle:
        handle.truncate(8 * 1024**4)
    message = run_checks(vllm_server_image_archive=str(archive))
    assert message.startswith(f"Loading {archive} (8192.0 GiB) needs about 16384.0 GiB free under /")
    assert "docker image prune -a" in message


def test_image_check_alone_refuses_a_missing_image(run_checks):
    # What the fleet rollout runs on every host before the first drain: image_check.yml without validate.yml.
    message = run_checks(steps=["image_check.yml"], vllm_server_image_tag="v0.32.9")
    assert message.startswith("Image onprem-test/not-an-image:v0.32.9 is not on localhost and the archive")
