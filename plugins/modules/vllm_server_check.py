#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The action plugin plugins/action/vllm_server_check.py does the work; this file is its documentation.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_server_check
short_description: A vLLM server's checks before the running server is touched, every refusal at once
version_added: 0.1.0
description:
  - Read-only. Reads the host once with M(onprem.vllm.vllm_host_info) (the server's container and the one an
    interrupted run set aside, whether the port is taken, the deployment's records, the pinned snapshot's
    C(config.json)), then decides on the controller (C(plugins/module_utils/vllm_server_checks.py)).
  - Fails naming every refusal at once - the settings (the plan check's own rules), the API key and its rotation key,
    a server bound beyond the host without a key, the GPUs assigned against O(gpu_count), a revision that is not a
    commit, trusted clients that are no certificates, the key in O(extra_args) or O(env), the port held by something
    else, and a pinned revision missing from the offline cache. A deployment record that cannot be read fails too.
  - The role C(onprem.vllm.vllm_server) calls it in C(tasks/validate.yml), before any change to a deployment.
author:
  - onprem.vllm developers (@onprem)
extends_documentation_fragment:
  - onprem.vllm.read_only
options:
  host_name:
    description: The host's name in the messages (the inventory name).
    type: str
    required: true
  container_name:
    description: The server's container; its records are named after it.
    type: str
    required: true
  config_dir:
    description: The folder of the server's records.
    type: str
    required: true
  settings:
    description:
      - The settings the plan check judges, by name without prefix (C(image_tag), C(image_digest), C(model),
        C(served_model_name), C(port), C(gpu_memory_utilization), C(tensor_parallel_size), C(pipeline_parallel_size),
        C(max_model_len), C(max_num_seqs), C(max_num_batched_tokens)); the messages name them C(vllm_server_*).
    type: dict
    required: true
  api_key:
    description: The server's API key (empty for none); only judged, never returned.
    type: raw
    default: ""
  api_key_rotation:
    description: The key a rotation introduces (empty outside a rotation); only judged, never returned.
    type: raw
    default: ""
  bind_address:
    description: The address the server publishes its port on.
    type: str
    default: 127.0.0.1
  port:
    description: The server's port on the host.
    type: int
    required: true
  cpu_mode:
    description: The server runs on the CPU (the lab); no GPU is assigned.
    type: bool
    default: false
  gpu_count:
    description: The GPUs the server takes (tensor parallel x pipeline parallel).
    type: int
    default: 1
  gpu_uuids:
    description: The GPUs assigned to the server.
    type: list
    elements: str
    default: []
  model:
    description: The model, for the messages.
    type: str
    default: ""
  model_revision:
    description: The commit the server runs (empty where the model is a local path).
    type: str
    default: ""
  hf_cache_path:
    description: The model cache, for the messages.
    type: str
    default: ""
  snapshot_config:
    description: The pinned revision's C(config.json) in the cache, which must exist (empty skips the check).
    type: str
    default: ""
  tls_clients:
    description: The PEM certificates the server trusts (empty for plain http).
    type: str
    default: ""
  extra_args:
    description: The server's extra vLLM arguments.
    type: list
    elements: raw
    default: []
  env:
    description: The server's extra environment.
    type: dict
    default: {}
  server_args_variable:
    description:
      - The variable holding the server's arguments, rendered once every other check passed (a setting the pinned
        vLLM does not take fails their rendering; a bad setting found above would only fail it again, vaguer).
      - Empty skips it.
    type: str
    default: ""
seealso:
  - module: onprem.vllm.vllm_host_info
  - module: onprem.vllm.vllm_deployment
"""

EXAMPLES = r"""
- name: Check the settings and the host before changing anything
  onprem.vllm.vllm_server_check:
    host_name: "{{ inventory_hostname }}"
    container_name: vllm
    config_dir: /etc/onprem-vllm
    settings: {image_tag: v0.33.0, model: Qwen/Qwen3-8B, port: 8000}
    api_key: "{{ vault_vllm_api_key }}"
    bind_address: 0.0.0.0
    port: 8000
    gpu_uuids: [GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f]
"""

RETURN = r"""
msg:
  description: Every refusal, or that the checks passed.
  returned: always
  type: str
refusals:
  description: One message per refusal; empty when the checks passed.
  returned: when the host was read
  type: list
  elements: str
port_listening:
  description: Whether something accepts connections on the server's port (its own server, where it runs).
  returned: when the host was read
  type: bool
"""
