# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input to vllm_server stops in its checks, before the running server is touched, with what to change.

Runs the role's check steps (tasks/validate.yml, tasks/image.yml) through ansible-playbook against this machine's
real Docker engine (local connection).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
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


def docker_ok():
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


pytestmark = pytest.mark.skipif(not docker_ok(), reason="no Docker engine (.ci/run starts one)")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_checks(tmp_path, steps=("validate.yml", "image.yml"), **overrides):
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK.replace("{steps}", json.dumps(list(steps))))
    variables = dict(BASE, ansible_python_interpreter=sys.executable, vllm_server_port=free_port(),
                     vllm_server_hf_cache_path=str(tmp_path / "hf"), vllm_server_image_archive=str(tmp_path / "a.tar"))
    variables.update(overrides)
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    playbook_bin = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook_bin, "-i", "localhost,", "-c", "local", "-e", json.dumps(variables), str(book)],
                          cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    results = [task["hosts"]["localhost"] for task in json.loads(proc.stdout)["plays"][0]["tasks"]]
    failed = [r for r in results if r.get("failed") and not r.get("ignored", False)]
    return failed[-1]["msg"] if failed else None


def test_unpinned_tag_is_refused(tmp_path):
    assert "must pin a release: pin a tag like v0.32.0 (got 'latest'" in run_checks(tmp_path, vllm_server_image_tag="latest")


def test_bad_numbers_and_names_are_refused_at_once(tmp_path):
    """The role's validate step uses the one settings check (module_utils/vllm_settings.py): every message at once."""
    message = run_checks(tmp_path, steps=("validate.yml",), vllm_server_max_model_len=-5, vllm_server_max_num_seqs=0,
                         vllm_server_served_model_name="", vllm_server_gpu_memory_utilization=1.5,
                         vllm_server_model="/models/x", vllm_server_port=70000)
    for expected in ("vllm_server_max_model_len must be a whole number >= 1 (got -5)",
                     "vllm_server_max_num_seqs must be a whole number >= 1 (got 0)",
                     "vllm_server_served_model_name must be a non-empty name without spaces",
                     "vllm_server_gpu_memory_utilization must be a fraction in (0, 1]",
                     "vllm_server_model is the path '/models/x', which the server's container does not have",
                     "vllm_server_port must be a TCP port 1..65535 (got 70000)"):
        assert expected in message


def test_open_port_without_api_key_is_refused(tmp_path):
    message = run_checks(tmp_path, vllm_server_bind_address="0.0.0.0", vllm_server_api_key="")
    assert "exposes the server beyond this host: set vllm_server_api_key (from Vault) or bind to 127.0.0.1" in message


def test_api_key_with_whitespace_is_refused(tmp_path):
    message = run_checks(tmp_path, vllm_server_api_key="REPLACE WITH ansible-vault encrypt_string")
    assert "vllm_server_api_key must be one string without spaces or newlines" in message


def test_tensor_parallel_larger_than_the_gpus_assigned(tmp_path):
    message = run_checks(tmp_path, vllm_server_cpu_mode=False, vllm_server_tensor_parallel_size=2,
                         vllm_server_gpu_uuids=["GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"])
    assert "tensor_parallel_size x pipeline_parallel_size = 2 GPUs, but 1 are assigned" in message


@pytest.mark.parametrize("extra, flag", [(["--api-key", "sec-value"], "--api-key"), (["--api_key", "sec-value"], "--api_key"),
                                         (["--api_key=sec-value"], "--api_key")])
def test_api_key_on_the_command_line_is_refused(tmp_path, extra, flag):
    message = run_checks(tmp_path, vllm_server_extra_args=extra)
    assert f"vllm_server_extra_args carries the API key flag ({flag})" in message and "sec-value" not in message


def test_api_key_in_the_environment_is_refused(tmp_path):
    message = run_checks(tmp_path, vllm_server_env={"VLLM_API_KEY": "sec-value"})
    assert "vllm_server_env sets VLLM_API_KEY" in message and "sec-value" not in message


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = run_checks(tmp_path, vllm_server_port=port)
    assert f"Port {port} on localhost is in use by something other than the onprem-test-vllm-absent container" in message


def test_revision_missing_from_the_offline_cache_is_refused(tmp_path):
    message = run_checks(tmp_path, vllm_server_model_revision="d77141a471636dda364651d872c8e1075b8947d5")
    assert "Revision d77141a471636dda364651d872c8e1075b8947d5 of onprem-lab/tiny-qwen3 is not in the cache" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_image_missing_and_no_archive_is_refused(tmp_path):
    message = run_checks(tmp_path)
    assert "Image onprem-test/not-an-image:v0.32.0 is not on localhost and the archive" in message


def test_a_valid_plan_passes_the_checks_until_the_image(tmp_path):
    # Everything before the image is fine: the only refusal is the (deliberately) missing image.
    message = run_checks(tmp_path, vllm_server_bind_address="0.0.0.0", vllm_server_api_key="lab-0123456789abcdef")
    assert message.startswith("Image onprem-test/not-an-image:v0.32.0 is not on localhost")


def test_archive_without_room_to_load_is_refused(tmp_path):
    # A sparse file: it claims 8 TiB and takes no space, so no disk here has twice that free.
    archive = tmp_path / "huge.tar"
    with archive.open("wb") as handle:
        handle.truncate(8 * 1024**4)
    message = run_checks(tmp_path, vllm_server_image_archive=str(archive))
    assert message.startswith(f"Loading {archive} (8192.0 GiB) needs about 16384.0 GiB free under /")
    assert "docker image prune -a" in message


def test_image_check_alone_refuses_a_missing_image(tmp_path):
    # What the fleet rollout runs on every host before the first drain: image_check.yml without validate.yml.
    message = run_checks(tmp_path, steps=["image_check.yml"], vllm_server_image_tag="v0.32.9")
    assert message.startswith("Image onprem-test/not-an-image:v0.32.9 is not on localhost and the archive")
