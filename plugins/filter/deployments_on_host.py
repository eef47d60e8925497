# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: deployments_on_host
short_description: The deployments of the plan that land on a host
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - A deployment lands on the hosts of its C(hosts) inventory group.
options:
  _input:
    description: The plan's deployments (C(onprem.vllm.plan_deployments)).
    type: list
    elements: dict
    required: true
  group_names:
    description: The host's groups (C(group_names)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: List what this host serves
  ansible.builtin.debug:
    msg: "{{ onprem_vllm_plan | onprem.vllm.deployments_on_host(group_names) | map(attribute='name') }}"
"""

RETURN = r"""
_value:
  description: The host's deployments, in plan order.
  type: list
  elements: dict
"""

from ansible_collections.onprem.vllm.plugins.module_utils.deployments import on_host


def deployments_on_host(deployments, group_names):
    return on_host(list(deployments), group_names)


class FilterModule:
    def filters(self):
        return {"deployments_on_host": deployments_on_host}
