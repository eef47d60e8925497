# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: plan_deployments
short_description: The plan's deployments, complete, from a host's variables
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - Reads C(onprem_vllm_deployments), the fleet-wide C(onprem_vllm_*) defaults and
    C(onprem_vllm_deployment_overrides) from a host's variables and returns every deployment with every key set.
    Without C(onprem_vllm_deployments) the one-model plan is a list of one deployment named C(default).
  - C(deployments_on_host) selects a host's deployments, C(deployment_placement_errors) proves their placement.
options:
  _input:
    description: A host's variables, C(hostvars[inventory_hostname]).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Read the plan once
  ansible.builtin.set_fact:
    onprem_vllm_plan: "{{ hostvars[inventory_hostname] | onprem.vllm.plan_deployments }}"
"""

RETURN = r"""
_value:
  description: The deployments (name, model, model_revision, served_model_name, served_model_aliases, hosts, runner,
    container_name, port, image, image_tag, image_digest, limits, extra_args, env, shares_gpu_with, ...).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.onprem.vllm.plugins.module_utils import deployments as plan


def _get(variables, name, default=None):
    return variables[name] if name in variables else default


def plan_deployments(variables):
    fleet = {key: _get(variables, "onprem_vllm_" + key) for key in plan.FLEET_KEYS}
    try:
        return plan.normalize(_get(variables, "onprem_vllm_deployments") or [], fleet,
                              _get(variables, "onprem_vllm_deployment_overrides") or {},
                              container_name=_get(variables, "onprem_vllm_container_name", "vllm"),
                              port=_get(variables, "onprem_vllm_port"),
                              served_model_name=_get(variables, "onprem_vllm_served_model_name", ""))
    except plan.PlanError as exc:
        raise AnsibleFilterError(f"The plan's deployments: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"plan_deployments": plan_deployments}
