# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: deployments_per_image
short_description: The first deployment of each image, so that a host checks and stages each image once
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - An image is its name, tag and digest; where O(restores) holds a deployment's record (C(playbooks/rollback.yml)),
    the record's image counts for that deployment.
  - C(playbooks/rollout.yml) checks and stages the images of a host's deployments through the first deployment of each.
positional: restores
options:
  _input:
    description: The host's deployments (C(onprem.vllm.deployments_on_host)).
    type: list
    elements: dict
    required: true
  restores:
    description: The records rollback.yml restores, by deployment name.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: List the images this host runs, by the first deployment of each
  ansible.builtin.debug:
    msg: "{{ onprem_vllm_plan | onprem.vllm.deployments_on_host(group_names) | onprem.vllm.deployments_per_image }}"
"""

RETURN = r"""
_value:
  description: The first deployment of each image, in the input's order.
  type: list
  elements: dict
"""

from ansible_collections.onprem.vllm.plugins.module_utils.deployments import first_per_image


def deployments_per_image(deployments, restores=None):
    return first_per_image(list(deployments), dict(restores or {}))


class FilterModule:
    def filters(self):
        return {"deployments_per_image": deployments_per_image}
