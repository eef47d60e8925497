# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: host_layout
short_description: Where the collection keeps its things on a host, each stated once
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - Returns the collection's fixed places (module_utils/host_layout.py), which the roles' defaults and the playbooks
    read instead of restating them.
  - V(config_dir) is vllm_server's configuration folder, V(gpu_fault_flag) the Xid monitor's GPU fault flag,
    V(gateway_runtime_dir) the gateway's folder holding HAProxy's admin socket, V(container_port) the port vLLM
    listens on inside its container.
options:
  _terms:
    description: The names to look up.
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Show vllm_server's configuration folder
  ansible.builtin.debug:
    msg: "{{ lookup('onprem.vllm.host_layout', 'config_dir') }}"
"""

RETURN = r"""
_raw:
  description: The value of each name, in order.
  type: list
  elements: raw
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.onprem.vllm.plugins.module_utils.host_layout import HOST_LAYOUT


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = [term for term in terms if term not in HOST_LAYOUT]
        if unknown:
            raise AnsibleLookupError("onprem.vllm.host_layout knows %s, not %s"
                                     % (", ".join(sorted(HOST_LAYOUT)), ", ".join(map(str, unknown))))
        return [HOST_LAYOUT[term] for term in terms]
