# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad input to vllm_server stops in its checks, before the running server is touched, with what to change.

Runs the role's check steps (tasks/validate.yml, tasks/image.yml) through ansible-playbook against this machine's
real Docker engine (local connection): every case below in one run, each case a host of its own.
"""
from __future__ import annotations

import socket

import pytest

PLAYBOOK = """
- name: vllm_server checks under test
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the checks
      ansible.builtin.include_role:
        name: vllm_server
        tasks_from: "{{ item }}"
      loop: "{{ case_steps }}"
"""
BASE = {  # a valid lab-like plan; each case breaks one thing
    "vllm_server_cpu_mode": True, "vllm_server_model": "onprem-lab/tiny-qwen3", "vllm_server_model_revision": "",
    "vllm_server_served_model_name": "qwen3-lab", "vllm_server_tensor_parallel_size": 1,
    "vllm_server_container_name": "onprem-test-vllm-absent", "vllm_server_image_tag": "v0.32.0",
    "vllm_server_image": "onprem-test/not-an-image",
}
BOTH = ["validate.yml", "image.yml"]
ARCHIVE_SIZE = 8 * 1024**4  # a sparse file: it claims 8 TiB and takes no space, so no disk here has twice that free
CASES = {
    "unpinned_tag": {"vllm_server_image_tag": "latest"},
    "bad_numbers": {"case_steps": ["validate.yml"], "vllm_server_max_model_len": -5, "vllm_server_max_num_seqs": 0,
                    "vllm_server_served_model_name": "", "vllm_server_gpu_memory_utilization": 1.5,
                    "vllm_server_model": "/models/x", "vllm_server_port": 70000},
    "open_port_without_key": {"vllm_server_bind_address": "0.0.0.0", "vllm_server_api_key": ""},
    "key_with_whitespace": {"vllm_server_api_key": "REPLACE WITH ansible-vault encrypt_string"},
    "rotation_key_with_whitespace": {"vllm_server_api_key_rotation": "REPLACE WITH ansible-vault encrypt_string"},
    "rotation_without_key": {"vllm_server_api_key": "", "vllm_server_api_key_rotation": "next-0123456789abcdef"},
    "tls_clients_not_pem": {"case_steps": ["validate.yml"], "vllm_server_tls_clients": "REPLACE WITH the gateway's"},
    "tp_larger_than_gpus": {"vllm_server_cpu_mode": False, "vllm_server_tensor_parallel_size": 2,
                            "vllm_server_gpu_uuids": ["GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"]},
    "key_flag": {"vllm_server_extra_args": ["--api-key", "sec-value"]},
    "key_flag_underscore": {"vllm_server_extra_args": ["--api_key", "sec-value"]},
    "key_flag_joined": {"vllm_server_extra_args": ["--api_key=sec-value"]},
    "key_in_env": {"vllm_server_env": {"VLLM_API_KEY": "sec-value"}},
    "dropped_flag": {"case_steps": ["validate.yml"], "vllm_server_extra_args": ["--max-num-partial-prefills", "2"]},
    "port_in_use": {},  # the port: a listener the fixture holds during the run
    "revision_not_cached": {"vllm_server_model_revision": "d77141a471636dda364651d872c8e1075b8947d5"},
    "image_missing": {},
    "valid_until_image": {"vllm_server_bind_address": "0.0.0.0", "vllm_server_api_key": "lab-0123456789abcdef"},
    "archive_too_big": {},  # the archive: the sparse file
    "image_check_alone": {"case_steps": ["image_check.yml"], "vllm_server_image_tag": "v0.32.9"},
}

pytestmark = pytest.mark.needs_docker


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def checks(playbook_cases, tmp_path_factory):
    """{case: the message that stopped it, or None}, with the port the port_in_use case found held."""
    tmp = tmp_path_factory.mktemp("vllm-server-checks")
    huge = tmp / "huge.tar"
    with huge.open("wb") as handle:
        handle.truncate(ARCHIVE_SIZE)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = holder.getsockname()[1]
        cases = {}
        for case, overrides in CASES.items():
            cases[case] = dict(dict(BASE, case_steps=BOTH, vllm_server_port=_free_port(),
                                    vllm_server_hf_cache_path=str(tmp / case / "hf"),
                                    vllm_server_image_archive=str(tmp / case / "a.tar")), **overrides)
        cases["port_in_use"]["vllm_server_port"] = held
        cases["archive_too_big"]["vllm_server_image_archive"] = str(huge)
        runs = playbook_cases(PLAYBOOK, cases, str(tmp))
    return {case: run.failure() for case, run in runs.items()}, held, huge


def test_unpinned_tag_is_refused(checks):
    assert "must pin a release: pin a tag like v0.32.0 (got 'latest'" in checks[0]["unpinned_tag"]


def test_bad_numbers_and_names_are_refused_at_once(checks):
    """The role's validate step uses the one settings check (module_utils/vllm_settings.py): every message at once."""
    message = checks[0]["bad_numbers"]
    for expected in ("vllm_server_max_model_len must be a whole number >= 1 (got -5)",
                     "vllm_server_max_num_seqs must be a whole number >= 1 (got 0)",
                     "vllm_server_served_model_name must be a non-empty name without spaces",
                     "vllm_server_gpu_memory_utilization must be a fraction in (0, 1]",
                     "vllm_server_model is the path '/models/x', which the server's container does not have",
                     "vllm_server_port must be a TCP port 1..65535 (got 70000)"):
        assert expected in message


def test_open_port_without_api_key_is_refused(checks):
    assert ("exposes the server beyond this host: set vllm_server_api_key (from Vault) or bind to 127.0.0.1"
            in checks[0]["open_port_without_key"])


def test_api_key_with_whitespace_is_refused(checks):
    assert "vllm_server_api_key must be one string without spaces or newlines" in checks[0]["key_with_whitespace"]


def test_a_bad_rotation_key_is_refused_naming_it(checks):
    assert ("vllm_server_api_key_rotation (the plan's onprem_vllm_api_key_rotation) must be one string without spaces"
            in checks[0]["rotation_key_with_whitespace"])
    assert "a rotation needs the current key too" in checks[0]["rotation_without_key"]


def test_trusted_clients_that_are_no_certificates_are_refused_naming_the_setting(checks):
    assert ("vllm_server_tls_clients must hold PEM certificates (-----BEGIN CERTIFICATE-----)"
            in checks[0]["tls_clients_not_pem"])


def test_tensor_parallel_larger_than_the_gpus_assigned(checks):
    assert "tensor_parallel_size x pipeline_parallel_size = 2 GPUs, but 1 are assigned" in checks[0]["tp_larger_than_gpus"]


@pytest.mark.parametrize("case, flag", [("key_flag", "--api-key"), ("key_flag_underscore", "--api_key"),
                                        ("key_flag_joined", "--api_key")])
def test_api_key_on_the_command_line_is_refused(case, flag, checks):
    message = checks[0][case]
    assert f"vllm_server_extra_args carries the API key flag ({flag})" in message and "sec-value" not in message


def test_a_flag_the_pinned_release_dropped_is_refused_naming_the_release_that_had_it(checks):
    assert ("vllm_server_extra_args has --max-num-partial-prefills, which vLLM 0.32.0's `vllm serve` does not have "
            "(vLLM 0.26.0 had it" in checks[0]["dropped_flag"])


def test_api_key_in_the_environment_is_refused(checks):
    message = checks[0]["key_in_env"]
    assert "vllm_server_env sets VLLM_API_KEY" in message and "sec-value" not in message


def test_port_in_use_is_refused(checks):
    messages, held, _huge = checks
    assert (f"Port {held} on port_in_use is in use by something other than the onprem-test-vllm-absent container"
            in messages["port_in_use"])


def test_revision_missing_from_the_offline_cache_is_refused(checks):
    message = checks[0]["revision_not_cached"]
    assert "Revision d77141a471636dda364651d872c8e1075b8947d5 of onprem-lab/tiny-qwen3 is not in the cache" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_image_missing_and_no_archive_is_refused(checks):
    assert "Image onprem-test/not-an-image:v0.32.0 is not on image_missing and the archive" in checks[0]["image_missing"]


def test_a_valid_plan_passes_the_checks_until_the_image(checks):
    # Everything before the image is fine: the only refusal is the (deliberately) missing image.
    assert checks[0]["valid_until_image"].startswith("Image onprem-test/not-an-image:v0.32.0 is not on valid_until_image")


def test_archive_without_room_to_load_is_refused(checks):
    messages, _held, huge = checks
    assert messages["archive_too_big"].startswith(f"Loading {huge} (8192.0 GiB) needs about 16384.0 GiB free under /")
    assert "docker image prune -a" in messages["archive_too_big"]


def test_image_check_alone_refuses_a_missing_image(checks):
    # What the fleet rollout runs on every host before the first drain: image_check.yml without validate.yml.
    assert checks[0]["image_check_alone"].startswith(
        "Image onprem-test/not-an-image:v0.32.9 is not on image_check_alone and the archive")
