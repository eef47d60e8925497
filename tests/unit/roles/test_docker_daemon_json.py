# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""daemon.json has one owner: container_toolkit only publishes the nvidia runtime's keys (tasks/docker_daemon_options.yml,
the last step of its main), which the playbook passes to docker_engine; docker_engine refuses to make nvidia the default
runtime from either input. The merge and the single restart run on real hosts in molecule's default and gpu_stack."""
from __future__ import annotations

import pytest

KEYS_PLAYBOOK = """
- name: The toolkit's daemon.json keys
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Publish them
      ansible.builtin.include_role:
        name: container_toolkit
        tasks_from: docker_daemon_options
    - name: Show them
      ansible.builtin.debug:
        var: container_toolkit_docker_daemon_options
"""
ENGINE_CHECK_PLAYBOOK = """
- name: docker_engine's settings check
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the role (its first task checks the settings)
      ansible.builtin.include_role:
        name: docker_engine
"""
NVIDIA = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}


@pytest.mark.parametrize("variables, expected", [
    ({}, NVIDIA),
    ({"container_toolkit_runtime_path": "/usr/bin/nvidia-container-runtime"},
     {"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []}}}),
    ({"container_toolkit_configure_docker": False}, {}),
    ({"container_toolkit_enabled": False}, {}),
    ({"onprem_vllm_cpu_mode": True}, {}),  # the lab: the role is off, so no runtime is registered
], ids=["gpu-host", "runtime-path", "configure-docker-off", "role-off", "lab-cpu-mode"])
def test_toolkit_publishes_only_the_nvidia_runtime(run_playbook, variables, expected):
    result = run_playbook(KEYS_PLAYBOOK, variables)
    assert result.rc == 0, result.failure()
    published = result.tasks[-1][1]["container_toolkit_docker_daemon_options"]
    assert published == expected
    assert "default-runtime" not in published


@pytest.mark.parametrize("variable", ["docker_engine_daemon_role_options", "docker_engine_daemon_options"])
def test_engine_refuses_nvidia_as_default_runtime_from_either_input(run_playbook, variable):
    # A host nothing answers for: the check runs on the controller; were it to pass, the next step could not touch
    # this machine's Docker.
    result = run_playbook(ENGINE_CHECK_PLAYBOOK, {variable: {"default-runtime": "nvidia"}}, host="nowhere",
                          inventory="nowhere ansible_host=127.0.0.1 ansible_port=9 ansible_connection=ssh\n")
    assert result.rc != 0
    assert "Do not set default-runtime=nvidia" in result.failure()
    assert result.tasks[-1][0].endswith("Check the docker_engine settings")  # stopped there, before any install
