#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: hf_model_info
short_description: Read a model's facts (commit, config.json, sizes, quantization) from the model itself
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - >-
    Reads one revision of a Hugging Face model where it lies and returns what the plan derives from it: the commit,
    the parsed C(config.json), the size of the revision's files (the free-space check), the weights' size (the KV
    plan), the quantization method and the dtype.
  - >-
    O(source=cache) reads an HF cache folder (C(models--ORG--NAME)) on the machine the module runs on: the host's cache
    once staged, or a folder in that layout. O(source=archive) reads a tarball of that folder in place (nothing is
    unpacked). O(source=hub) asks the hub's API for the revision's files and sizes and downloads C(config.json) and the
    safetensors index (a few KB); the weights are never downloaded.
  - A branch or tag is resolved through the folder's or archive's C(refs/) (what hf_cache pins on the hosts), or by
    the hub.
extends_documentation_fragment:
  - onprem.vllm.read_only
options:
  source:
    description: Where the model lies.
    type: str
    required: true
    choices: [cache, archive, hub]
  model:
    description: The model id, C(Org/Name).
    type: str
    required: true
  revision:
    description: A 40-hex commit, or a branch or tag.
    type: str
    required: true
  path:
    description:
      - For O(source=cache), the C(models--ORG--NAME) folder; for O(source=archive), the tarball (any compression
        Python's tarfile reads).
    type: path
  hub_endpoint:
    description: For O(source=hub), the hub's base URL.
    type: str
    default: https://huggingface.co
  token:
    description: For O(source=hub), the hub token (gated or private models); sent as a bearer token, never returned.
    type: str
    default: ""
  request_timeout:
    description: Seconds each hub request may take.
    type: int
    default: 30
notes:
  - Read-only. The hub source needs the machine it runs on (usually the controller) to reach the hub.
"""

EXAMPLES = r"""
- name: Read the model's facts from the hub on the controller
  onprem.vllm.hf_model_info:
    source: hub
    model: Qwen/Qwen3-30B-A3B-FP8
    revision: main
    token: "{{ vault_hf_token }}"
  delegate_to: localhost
  register: model

- name: Read them from the host's HF cache once staged
  onprem.vllm.hf_model_info:
    source: cache
    model: Qwen/Qwen3-30B-A3B-FP8
    revision: main
    path: /srv/hf-cache/hub/models--Qwen--Qwen3-30B-A3B-FP8
  register: model
"""

RETURN = r"""
model_info:
  description: The revision's facts.
  returned: success
  type: dict
  contains:
    commit:
      description: The 40-hex commit the revision names.
      type: str
    config:
      description: The parsed config.json.
      type: dict
    files:
      description: How many files the revision holds.
      type: int
    size_bytes:
      description: The total size of the revision's files (what staging it writes).
      type: int
    weight_bytes:
      description: The safetensors weights' size (the index's total_size, else the files'); null when there are none.
      type: int
    quantization:
      description: The config's quantization method (C(fp8), C(awq), ...); empty when not quantized.
      type: str
    dtype:
      description: The config's dtype (C(bfloat16), ...).
      type: str
    origin:
      description: Where the facts were read, in words.
      type: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.onprem.vllm.plugins.module_utils.hf_model_source import (
    MAX_SMALL_FILE_BYTES,
    ModelSourceError,
    from_archive,
    from_cache_folder,
    from_hub,
)


def hub_fetcher(token, timeout):
    headers = {"Authorization": "Bearer %s" % token} if token else {}

    def fetch_json(url):
        try:
            answer = open_url(url, headers=headers, timeout=timeout, follow_redirects="all")
            body = answer.read(MAX_SMALL_FILE_BYTES + 1)
        except HTTPError as exc:
            hint = {401: " (a gated or private model: give the Vault-held hub token)",
                    403: " (the token may not read this model: accept its licence on the hub)",
                    404: " (no such model or revision)"}.get(exc.code, "")
            raise ModelSourceError("the hub answered %s to %s%s" % (exc.code, url.split("?")[0], hint))
        except (URLError, OSError) as exc:
            raise ModelSourceError("cannot reach %s: %s" % (url.split("?")[0], exc))
        try:
            return json.loads(body.decode("utf-8"))
        except ValueError:
            raise ModelSourceError("%s did not answer JSON" % url.split("?")[0])

    return fetch_json


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", required=True, choices=["cache", "archive", "hub"]),
            model=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            path=dict(type="path"),
            hub_endpoint=dict(type="str", default="https://huggingface.co"),
            token=dict(type="str", default="", no_log=True),
            request_timeout=dict(type="int", default=30),
        ),
        required_if=[("source", "cache", ("path",)), ("source", "archive", ("path",))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["source"] == "cache":
            info = from_cache_folder(params["path"], params["revision"])
        elif params["source"] == "archive":
            info = from_archive(params["path"], params["model"], params["revision"])
        else:
            info = from_hub(hub_fetcher(params["token"], params["request_timeout"]), params["hub_endpoint"],
                            params["model"], params["revision"])
    except ModelSourceError as exc:
        module.fail_json(msg="%s at %s: %s" % (params["model"], params["revision"], exc))
    module.exit_json(changed=False, model_info=info)


if __name__ == "__main__":
    main()
