#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_deployment_record
short_description: Write a vLLM deployment's records and in-progress marker on its host
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - The writer of the files that say what a deployment runs (vllm_server's C(deploy.yml) and C(reconcile.yml)), in
    the server's config directory for its container O(name) - C(NAME.deployment.json) (what runs and last passed its
    gate), C(NAME.deployment.previous.json) (the deployment it replaced; C(playbooks/rollback.yml) restores it) and
    C(NAME.rollout.json) (the in-progress marker, written before a running server is set aside).
  - O(state=started) writes the marker - O(record), the record it replaces (the current record, read here, when
    O(replaces) is true) and O(deployment_id).
  - O(state=passed) writes the records of a server that passed its gate - the marker's replaced record as the
    previous one, then O(record) (else the marker's new record) as the current one. Without a marker only O(record).
  - O(state=finished) removes the marker.
  - Each file is written whole (mode 0600, a temporary file renamed over it) and only where it differs.
  - C(onprem.vllm.vllm_host_info)'s O(onprem.vllm.vllm_host_info#module:deployment_records) reads the files.
options:
  config_dir:
    description: The server's config directory (vllm_server_config_dir); it must exist.
    type: path
    required: true
  name:
    description: The server's container name (one deployment on the host).
    type: str
    required: true
  state:
    description: What to write (see the description).
    type: str
    required: true
    choices: [started, passed, finished]
  record:
    description: >-
      The deployment's record (vllm_server's prepare.yml describes it): required for O(state=started); for
      O(state=passed) the record to keep as current (default, the marker's new record).
    type: dict
  deployment_id:
    description: For O(state=started), the id the new container carries as its label C(onprem.vllm.deployment).
    type: str
    default: ""
  replaces:
    description: For O(state=started), whether a server runs under O(name) that the new one replaces.
    type: bool
    default: false
notes:
  - Check mode is supported.
attributes:
  check_mode:
    description: Reports what would be written, writes nothing.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
"""

EXAMPLES = r"""
- name: Write the in-progress marker before the running server is set aside
  onprem.vllm.vllm_deployment_record:
    config_dir: /etc/onprem-vllm
    name: vllm
    state: started
    record: "{{ new_record }}"
    deployment_id: "{{ deployment_id }}"
    replaces: true

- name: The new server passed its gate - record it, keeping the one it replaced
  onprem.vllm.vllm_deployment_record:
    config_dir: /etc/onprem-vllm
    name: vllm
    state: passed
    record: "{{ new_record | combine({'kv_cache': kv_check.record}) }}"
"""

RETURN = r"""
changed_paths:
  description: The files written or removed (or that would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/onprem-vllm/vllm.deployment.previous.json, /etc/onprem-vllm/vllm.deployment.json]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_record


def _writes(p, files):
    if p["state"] == "started":
        replaced = deployment_record.read(files["current"]) if p["replaces"] else None
        content = deployment_record.marker(p["record"], replaced, p["deployment_id"])
        return [(files["marker"], deployment_record.dumps(content))]
    pending = deployment_record.read(files["marker"])
    return deployment_record.passed_writes(p["config_dir"], p["name"], pending, p["record"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config_dir=dict(type="path", required=True),
            name=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["started", "passed", "finished"]),
            record=dict(type="dict"),
            deployment_id=dict(type="str", default=""),
            replaces=dict(type="bool", default=False),
        ),
        required_if=[("state", "started", ["record"])],
        supports_check_mode=True,
    )
    p = module.params
    if not os.path.isdir(p["config_dir"]):
        module.fail_json(msg="%s is not a directory: the server's config directory must exist" % p["config_dir"])
    changed_paths = []
    try:
        files = deployment_record.paths(p["config_dir"], p["name"])
        if p["state"] == "finished":
            if os.path.lexists(files["marker"]):
                changed_paths.append(files["marker"])
                if not module.check_mode:
                    os.unlink(files["marker"])
        else:
            for path, content in _writes(p, files):
                if module.check_mode and deployment_record.differs(path, content):
                    changed_paths.append(path)
                elif not module.check_mode and deployment_record.write(path, content):
                    changed_paths.append(path)
    except (deployment_record.RecordError, OSError) as exc:
        module.fail_json(msg=str(exc), changed_paths=changed_paths)
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
