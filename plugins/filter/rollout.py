# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: deployment_canaries
short_description: Each deployment's canary host in a rollout
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - A deployment's canary is the first of the rollout's hosts (in play order) that runs it, i.e. that is in the
    deployment's C(hosts) inventory group. C(playbooks/rollout.yml) rolls every deployment on its canary, one host at
    a time, before any batch.
positional: hosts, groups
options:
  _input:
    description: The plan's deployments (C(onprem.vllm.plan_deployments)).
    type: list
    elements: dict
    required: true
  hosts:
    description: The rollout's hosts in play order, such as C(ansible_play_hosts_all).
    type: list
    elements: str
    required: true
  groups:
    description: The inventory's groups and their hosts (the magic variable C(groups)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show which host is each deployment's canary
  ansible.builtin.debug:
    msg: "{{ onprem_vllm_plan | onprem.vllm.deployment_canaries(ansible_play_hosts_all, groups) }}"
"""

RETURN = r"""
_value:
  description: The canary host of each deployment by name; a deployment on none of the hosts is left out.
  type: dict
  sample: {chat: ws-01, router: ws-01, embed: ws-01}
"""

from ansible_collections.onprem.vllm.plugins.module_utils.deployments import canaries


def deployment_canaries(deployments, hosts, groups):
    return canaries(list(deployments), list(hosts), dict(groups))


class FilterModule:
    def filters(self):
        return {"deployment_canaries": deployment_canaries}
