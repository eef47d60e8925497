# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan's revision main, as inventories/example pins it, against the lab share's model tarball (it carries
refs/main): hf_cache resolves it once to the commit and publishes it (hf_cache_result.commit); the playbooks' wiring
(playbooks/tasks/model_commit.yml, per deployment) hands that commit to vllm_server, whose offline-cache check passes on
snapshots/<commit>; a later run that did not stage (rollout.yml alone) resolves the same commit read-only; and
vllm_server given a branch name is refused with what to change."""
from __future__ import annotations

import os

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
COMMIT = "d77141a471636dda364651d872c8e1075b8947d5"
PLAYBOOK = """
- name: Revision flow under test
  hosts: localhost
  gather_facts: false
  vars:
    # The one-model plan's deployment, as playbooks/vars/deployment.yml names it; nothing restored.
    _onprem_deployment: {{name: default}}
    _onprem_restore: {{}}
  tasks:
    - name: Stage with hf_cache
      ansible.builtin.include_role:
        name: hf_cache
      when: stage | bool
    - name: The playbooks' wiring
      ansible.builtin.include_tasks: {root}/playbooks/tasks/model_commit.yml
    - name: vllm_server's checks with the commit
      ansible.builtin.include_role:
        name: vllm_server
        tasks_from: validate.yml
        public: true  # its derived arguments (vars/main.yml) for the dump below
      vars:
        vllm_server_model_revision: "{{{{ revision_override | default(_onprem_model_commits.default) }}}}"
    - name: Dump
      vars:
        vllm_server_model_revision: "{{{{ revision_override | default(_onprem_model_commits.default) }}}}"
      ansible.builtin.debug:
        msg:
          resolved: "{{{{ hf_cache_result.commit | default('') }}}}"
          commit: "{{{{ _onprem_model_commits.default }}}}"
          args: "{{{{ _vllm_server_args }}}}"
"""


pytestmark = [pytest.mark.needs_lab_share, pytest.mark.needs_docker]


@pytest.fixture
def run(run_playbook, tmp_path, free_port, lab_model_tarball):
    """run(stage=True, **extra) -> (the refusal or None, what the play dumped)."""
    def play(stage=True, **extra):
        variables = {
            "stage": stage,
            "onprem_vllm_model": "onprem-lab/tiny-qwen3", "onprem_vllm_model_revision": "main",
            "onprem_vllm_hf_cache_path": str(tmp_path / "hf"), "onprem_vllm_cpu_mode": True,
            "onprem_vllm_tensor_parallel_size": 1, "onprem_vllm_served_model_name": "qwen3-lab",
            "onprem_vllm_container_name": "gpuws-test-vllm-absent", "onprem_vllm_port": free_port(),
            "hf_cache_source": "archive", "hf_cache_archive": lab_model_tarball, "hf_cache_archive_remote_src": True,
            "hf_cache_free_space_margin_bytes": 0,
        }
        result = run_playbook(PLAYBOOK.format(root=ROOT), dict(variables, **extra), timeout=240)
        dump = [r["msg"] for r in result.results if isinstance(r.get("msg"), dict) and "commit" in r["msg"]]
        return result.failure(), (dump[-1] if dump else None)
    return play


def test_main_resolves_once_and_reaches_vllm_server(tmp_path, run):
    msg, out = run()
    assert msg is None, msg
    assert out["resolved"] == COMMIT and out["commit"] == COMMIT
    assert out["args"][out["args"].index("--revision") + 1] == COMMIT
    # refs/main came from the tarball: the same commit a later run reads without staging (rollout.yml alone).
    assert (tmp_path / "hf" / "hub" / "models--onprem-lab--tiny-qwen3" / "refs" / "main").read_text().strip() == COMMIT
    msg, out = run(stage=False)
    assert msg is None, msg
    assert out["commit"] == COMMIT


def test_rollout_alone_on_an_unstaged_host_is_refused(run):
    msg, dummy = run(stage=False)
    assert "onprem-lab/tiny-qwen3 at main is not staged on localhost" in msg
    assert "run playbooks/provision.yml (the hf_cache role) first" in msg


def test_vllm_server_refuses_a_branch_name(run):
    msg, dummy = run(revision_override="main")
    assert "vllm_server_model_revision must be the 40-hex commit the server runs, not 'main'" in msg
    assert "pin the branch or tag in the plan's onprem_vllm_model_revision" in msg
