# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_secret_settings_errors
short_description: Messages for settings that would put the vLLM API key into argv or the container's environment
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Finds every spelling of the API key flag in the extra arguments (C(--api-key), C(--api_key), C(=)-joined, an
    abbreviation argparse would expand) and C(VLLM_API_KEY) in the extra environment. The messages name the setting,
    never its value.
positional: env
options:
  _input:
    description: The extra C(vllm serve) arguments (vllm_server_extra_args).
    type: list
    elements: str
    required: true
  env:
    description: The extra container environment (vllm_server_env).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse the key on the command line
  ansible.builtin.assert:
    that: _errors | length == 0
    fail_msg: "{{ _errors | join(' ') }}"
  vars:
    _errors: "{{ vllm_server_extra_args | onprem.vllm.vllm_secret_settings_errors(vllm_server_env) }}"
"""

RETURN = r"""
_value:
  description: One message per offending setting; empty when none.
  type: list
  elements: str
"""

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_secret_args import secret_settings_errors


class FilterModule:
    def filters(self):
        return {"vllm_secret_settings_errors": secret_settings_errors}
