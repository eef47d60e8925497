# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_settings_errors
short_description: Every problem with a vLLM server's numeric and string settings, as messages
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Checks the settings a vLLM server is started with (counts >= 1, a port, the memory fraction, the served name,
    the model id or mounted path, the pinned image tag and digest) and returns one message per bad value, naming the
    inventory variable and what to set. An empty list means the settings are good.
  - The plan check (and through it the rollouts' checks) and the vllm_server role use it, so they refuse the same
    values, each naming its own variables (C(prefix)).
options:
  _input:
    description:
      - The settings, keyed without the prefix (image_tag, image_digest, model, served_model_name,
        port, gpu_memory_utilization, tensor_parallel_size, pipeline_parallel_size, max_model_len, max_num_seqs,
        max_num_batched_tokens); keys left out are not checked.
    type: dict
    required: true
  prefix:
    description: The prefix of the variables the messages name (the plan's C(onprem_vllm_), a role's own).
    type: str
    default: vllm_server_
"""

EXAMPLES = r"""
- name: Refuse bad settings
  ansible.builtin.assert:
    that: _errors | length == 0
    fail_msg: "{{ _errors | join(' ') }}"
  vars:
    _errors: "{{ {'max_model_len': onprem_vllm_max_model_len} | onprem.vllm.vllm_settings_errors('onprem_vllm_') }}"
"""

RETURN = r"""
_value:
  description: One message per bad value; empty when every setting is good.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_settings import settings_errors


def vllm_settings_errors(settings, prefix="vllm_server_"):
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"vllm_settings_errors expects a dict of settings, got {type(settings).__name__}")
    return settings_errors(dict(settings), str(prefix))


class FilterModule:
    def filters(self):
        return {"vllm_settings_errors": vllm_settings_errors}
