#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: hf_cache_revision_info
short_description: Say whether a model's pinned revision is in a host's Hugging Face cache, and read its facts there
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - >-
    One read of the host's cache (each task is a round trip to the host) for the hf_cache role: the model's cache
    folder (C(hub/models--ORG--NAME)), the commit the revision names (a branch or tag resolves through the folder's
    C(refs/), written by the first staging, so a later run never follows a moved branch), and whether that commit's
    snapshot is staged (it has its C(config.json)).
  - With O(read_facts), the staged revision's facts as M(onprem.vllm.hf_model_info) reads them from the cache.
extends_documentation_fragment:
  - onprem.vllm.read_only
options:
  path:
    description: The cache's root folder (the one holding C(hub/)).
    type: path
    required: true
  model:
    description: The model id, C(Org/Name), whose folder C(hub/models--Org--Name) is read.
    required: true
    type: str
  revision:
    description: The pinned revision, a 40-hex commit, or a branch or tag staged earlier.
    required: true
    type: str
  read_facts:
    description: Also read the staged revision's facts (RV(model_info)).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Find out whether the pinned revision is cached, and read its facts there
  onprem.vllm.hf_cache_revision_info:
    path: /srv/hf-cache
    model: Qwen/Qwen3-30B-A3B-FP8
    revision: main
    read_facts: true
  register: cached
"""

RETURN = r"""
repo_path:
  description: The model's cache folder (it may not exist yet).
  returned: always
  type: str
  sample: /srv/hf-cache/hub/models--Qwen--Qwen3-30B-A3B-FP8
commit:
  description: The 40-hex commit the revision names; empty for a branch or tag not staged yet.
  returned: always
  type: str
staged:
  description: Whether the commit's snapshot is in the cache (it has its config.json).
  returned: always
  type: bool
model_info:
  description:
    - The staged revision's facts, as M(onprem.vllm.hf_model_info) returns them.
    - Empty unless O(read_facts) and the revision is staged.
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.onprem.vllm.plugins.module_utils.hf_model_source import (
    ModelSourceError,
    cached_revision,
    from_cache_folder,
    repo_folder,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            model=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            read_facts=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    repo_path = os.path.join(params["path"], "hub", repo_folder(params["model"]))
    commit, staged = cached_revision(repo_path, params["revision"])
    info = {}
    if staged and params["read_facts"]:
        try:
            info = from_cache_folder(repo_path, commit)
        except ModelSourceError as exc:
            module.fail_json(msg="%s at %s: %s" % (params["model"], params["revision"], exc))
    module.exit_json(changed=False, repo_path=repo_path, commit=commit, staged=staged, model_info=info)


if __name__ == "__main__":
    main()
