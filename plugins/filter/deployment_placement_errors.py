# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: deployment_placement_errors
short_description: Every problem with the plan's deployments and what lands on one host, as messages
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - The plan as a whole (unique names, served names and aliases, containers; runners; what a shared GPU refers to)
    and one host's part of it (unique ports, enough whole GPUs, shared GPUs whose memory fractions fit). Each message
    names the deployment, the host and the fix; an empty list means the placement is proved.
options:
  _input:
    description: The plan's deployments (C(onprem.vllm.plan_deployments)).
    type: list
    elements: dict
    required: true
  host:
    description: The host's inventory name.
    type: str
    required: true
  group_names:
    description: The host's groups.
    type: list
    elements: str
    required: true
  gpus:
    description: The host's GPU count (0 when unknown).
    type: int
    default: 0
  cpu_mode:
    description: The lab's CPU mode (no GPU accounting).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Prove the placement
  ansible.builtin.assert:
    that: _errors | length == 0
    fail_msg: "{{ _errors | join(' ') }}"
  vars:
    _errors: "{{ onprem_vllm_plan | onprem.vllm.deployment_placement_errors(inventory_hostname, group_names, 2) }}"
"""

RETURN = r"""
_value:
  description: One message per problem.
  type: list
  elements: str
"""

from ansible_collections.onprem.vllm.plugins.module_utils import deployments as plan


def deployment_placement_errors(deployments, host, group_names, gpus=0, cpu_mode=False):
    deployments = list(deployments)
    return plan.fleet_errors(deployments) + plan.placement_errors(deployments, str(host), list(group_names),
                                                                  int(gpus or 0), bool(cpu_mode))


class FilterModule:
    def filters(self):
        return {"deployment_placement_errors": deployment_placement_errors}
