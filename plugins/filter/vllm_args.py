# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_serve_args
short_description: Render C(vllm serve) arguments for a pinned vLLM version
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Turns a dict of server settings into the argument list of the vllm/vllm-openai container, with flags spelled
    the way the pinned vLLM version expects (for example no C(--disable-log-requests) on 0.20 and later).
positional: version
options:
  _input:
    description: Settings; keys as in the vllm_server role without its prefix (model, revision, served_model_name, ...).
    type: dict
    required: true
  version:
    description: The vLLM version of the image, such as C(v0.32.0).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Render the arguments
  ansible.builtin.debug:
    msg: "{{ {'model': 'Qwen/Qwen3-8B', 'tensor_parallel_size': 2} | onprem.vllm.vllm_serve_args('v0.32.0') }}"
"""

RETURN = r"""
_value:
  description: The container's argument list.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_args import VllmArgsError, render_serve_args


def vllm_serve_args(settings, version):
    try:
        return render_serve_args(settings, version)
    except VllmArgsError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"vllm_serve_args": vllm_serve_args}
