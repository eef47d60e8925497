# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_gateway_step
short_description: What a rollout does at the gateways around one deployment of one host
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - C(playbooks/tasks/rollout_deployment.yml) asks it, from what the deployment's step has done so far, whether to
    drain the server, whether to undrain it after its gate passed, and, once the step failed, whether the restored
    server goes back in rotation or the host stays out (C(plugins/module_utils/rollout_gateway.py) decides).
  - A server goes back in rotation only where it passed a gate, was never replaced, or was restored to the server
    that passed the last gate.
positional: gateway, listing, deployment, gpu_return, gateways
options:
  _input:
    description: The deployment's C(vllm_server_result) so far (prepare's, then deploy's); empty before prepare returned.
    type: dict
    required: true
  gateway:
    description: The drain's C(gateway_result) so far; empty before a drain.
    type: dict
    required: true
  listing:
    description:
      - The registered result of the run's read-only check that each gateway lists each deployment of the host
        (C(playbooks/tasks/rollout_host_checks.yml)); an item is changed where the server is out of rotation there.
      - None where that check did not run; the undrain then runs after every passed gate.
    type: raw
    required: true
  deployment:
    description: The deployment's name.
    type: str
    required: true
  gpu_return:
    description: Whether the host returns after a GPU fault (C(playbooks/gpu_return.yml)); its servers stay out when one fails.
    type: bool
    required: true
  gateways:
    description: How many gateways the host is served through.
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Drain the server only when it is replaced
  ansible.builtin.include_role:
    name: onprem.vllm.gateway
    tasks_from: drain
  when: (vllm_server_result | onprem.vllm.rollout_gateway_step(gateway_result, none, 'chat', false, 1)).drain
"""

RETURN = r"""
_value:
  description: The step's decisions.
  type: dict
  contains:
    drain:
      description: Take the server out of rotation before the deploy (it is replaced).
      type: bool
    undrain:
      description: After a passed gate, put the server back (unless the run's checks found it in rotation and this run did not drain it).
      type: bool
    undrain_restored:
      description: After a failure, put the restored (or untouched) server back, once it passes the gateway's checks.
      type: bool
    stays_out_cut_short:
      description: After a failure, the host stays out of rotation because its previous server was not restored.
      type: bool
"""

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.onprem.vllm.plugins.module_utils.rollout_gateway import step


def rollout_gateway_step(server, gateway, listing, deployment, gpu_return, gateways):
    # boolean(): a "false" string from an extra variable is false, not a non-empty string.
    return step(dict(server or {}), dict(gateway or {}), listing, str(deployment), boolean(gpu_return, strict=False),
                int(gateways))


class FilterModule:
    def filters(self):
        return {"rollout_gateway_step": rollout_gateway_step}
