#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_kv_cache_info
short_description: Compare the KV cache a running vLLM server allocated with the plan's prediction
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Runs on the vLLM host after the health gate. Reads C(/metrics)' C(vllm:cache_config_info) (the engine's block
    count and block size, the pinned C(kv_cache_memory_bytes)) and compares the KV tokens with O(predicted), the
    KV plan of C(onprem.vllm.kv_headroom).
  - Returns the entry the deployment record keeps (C(record)). A difference beyond O(max_difference_pct) is a
    warning, never a failure (the server passed its gate and serves); a server whose metric cannot be read is a
    warning too.
extends_documentation_fragment:
  - onprem.vllm.read_only
  - onprem.vllm.vllm_server
options:
  predicted:
    description: >-
      The KV plan (the result of C(onprem.vllm.kv_headroom), as gpu_preflight_result.kv_plan publishes it); empty when
      no plan reached the caller (then only the actual allocation is recorded).
    type: dict
    default: {}
  max_difference_pct:
    description: Warn when the actual KV tokens differ from the predicted ones by more than this percentage.
    type: float
    default: 5.0
  request_timeout:
    description: Seconds the request may take.
    type: int
    default: 30
notes:
  - vLLM exports C(vllm:cache_config_info) from 0.8 (V1 engine); C(num_gpu_blocks) is filled once the engine core
    allocated its cache, i.e. always after a passed health gate.
"""

EXAMPLES = r"""
- name: Record the KV cache vLLM allocated against the plan
  onprem.vllm.vllm_kv_cache_info:
    url: http://127.0.0.1:8000
    predicted: "{{ gpu_preflight_result.kv_plan }}"
    max_difference_pct: 5
  register: kv
"""

RETURN = r"""
record:
  description: >-
    predicted (the plan's kv_cache_tokens, num_gpu_blocks, max_concurrency, max_model_len, available_kv_cache_bytes,
    kv_cache_memory_bytes), actual (num_gpu_blocks, block_size, kv_cache_tokens, kv_cache_memory_bytes, cache_dtype,
    max_concurrency at the plan's max_model_len), difference_tokens, difference_pct, max_difference_pct, within_limit.
  returned: always
  type: dict
  sample: {"predicted": {"kv_cache_tokens": 1048576}, "actual": {"kv_cache_tokens": 1048576},
           "difference_tokens": 0, "difference_pct": 0.0, "max_difference_pct": 5.0, "within_limit": true}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_http
from ansible_collections.onprem.vllm.plugins.module_utils.kv_actual import check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vllm_http.SERVER_ARGUMENT_SPEC,
            predicted=dict(type="dict", default={}),
            max_difference_pct=dict(type="float", default=5.0),
            request_timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    params = module.params
    problem = vllm_http.tls_problem(params)
    if problem:
        module.fail_json(msg=problem)
    server = vllm_http.Server(params, timeout=params["request_timeout"])

    def read_metrics():
        answer = server.request("GET", "/metrics")
        if answer.status != 200:
            raise OSError("/metrics answered HTTP %d" % answer.status)
        return answer.body

    entry, why, warning = check(read_metrics, params["predicted"], params["max_difference_pct"])
    # In check mode a server that a real run would first deploy is not there yet: nothing to warn about.
    if why and not (module.check_mode and "cannot read" in why):
        module.warn("KV check: %s; the deployment record keeps no actual KV allocation." % why)
    if warning:
        module.warn(warning)
    module.exit_json(changed=False, record=entry)


if __name__ == "__main__":
    main()
