# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: gateway_canary_token
short_description: The token that pins a request at the gateway to one server of a deployment
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - A request through the gateway that carries it in C(X-Onprem-Canary) is answered by that server or not at all (no
    retry elsewhere, even where the server is drained). The rollout's undrain sends its canary with it, and
    C(playbooks/benchmark.yml) measures each server through the gateway with it.
  - Derived from the servers' API key (the gateway's C(gateway_backend_api_key)), so only who holds that key can pin.
positional: deployment, server
options:
  _input:
    description: The servers' API key.
    type: str
    required: true
  deployment:
    description: The deployment's name (its backend is C(vllm-<name>)).
    type: str
    required: true
  server:
    description: The server's inventory host name.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Pin a request to this host's chat server
  ansible.builtin.uri:
    url: https://gateway.example.org:4000/v1/completions
    headers:
      X-Onprem-Canary: "{{ vault_vllm_api_key | onprem.vllm.gateway_canary_token('chat', inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: The token, 64 hex digits.
  type: str
"""

import hashlib


def gateway_canary_token(key, deployment, server):
    return hashlib.sha256(("%s:canary:vllm-%s/%s" % (key, deployment, server)).encode()).hexdigest()


class FilterModule:
    def filters(self):
        return {"gateway_canary_token": gateway_canary_token}
