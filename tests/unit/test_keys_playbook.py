# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/keys.yml refuses a rotation without a key before anything runs (a key turned on or off is a rollout)."""
from __future__ import annotations

import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_an_empty_key_is_refused_before_the_plan_check(run_playbook):
    run = run_playbook("- ansible.builtin.import_playbook: %s/playbooks/keys.yml\n" % ROOT,
                       {"onprem_vllm_api_key": ""},
                       inventory="[vllm_servers]\nlocalhost ansible_connection=local\n")
    assert run.rc != 0 and run.failed
    assert "onprem_vllm_api_key is empty on localhost: there is no key to rotate" in run.failure()
    assert "playbooks/rollout.yml" in run.failure()
    # Nothing else ran: not the plan check, no key file, no gateway.
    assert [name for name, _result in run.tasks] == ["Refuse a rotation without a key"]
