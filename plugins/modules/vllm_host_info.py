#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_host_info
short_description: Read in one call what a host holds of a vLLM deployment (containers, image, port, files)
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - Read-only. One module run instead of one per question, since over SSH each task is a round trip, and a rollout asks
    these before every host's deployment (M(onprem.vllm.vllm_server_check) in vllm_server's C(validate.yml), and
    C(image_check.yml)).
  - Containers and the image through the C(docker) CLI's C(inspect) (one call each; a missing object is an answer,
    any other Docker error fails the task); the port by a TCP connection; files and paths on the host's filesystem.
  - When the image is missing and O(image_archive) is given, also whether the archive exists, its size, Docker's data
    root and the bytes free there (what loading the archive needs).
extends_documentation_fragment:
  - onprem.vllm.read_only
options:
  container_names:
    description: Containers to look up by name.
    type: list
    elements: str
    default: []
  image:
    description: An image reference (C(repo:tag) or C(repo:tag@sha256:...)) to look up; empty skips.
    type: str
    default: ""
  image_archive:
    description: The C(docker save) archive the missing O(image) would be loaded from; empty skips.
    type: str
    default: ""
  port:
    description: A TCP port to test for a listener on O(port_host); 0 skips.
    type: int
    default: 0
  port_host:
    description: The address O(port) is tested on.
    type: str
    default: 127.0.0.1
  deployment_records:
    description: >-
      A deployment's records to read (C(onprem.vllm.vllm_deployment) writes them); omitted skips.
    type: dict
    suboptions:
      config_dir:
        description: The server's config directory.
        type: path
        required: true
      name:
        description: The server's container name.
        type: str
        required: true
      rollback_target:
        description: Also return what a rollback restores from the previous record (fails on a record without it).
        type: bool
        default: false
  paths:
    description: Absolute paths to test for existence.
    type: list
    elements: str
    default: []
notes:
  - Check mode is supported.
"""

EXAMPLES = r"""
- name: Read the server's containers, the port, the in-progress marker and the cached model at once
  onprem.vllm.vllm_host_info:
    container_names: [vllm, vllm-previous]
    port: 8000
    deployment_records: {config_dir: /etc/onprem-vllm, name: vllm}
    paths: [/var/lib/onprem-vllm/hf/hub/models--Qwen--Qwen3-30B-A3B-FP8/snapshots/0123abcd/config.json]
  register: host_state

- name: Is the pinned image there, or can its archive be loaded?
  onprem.vllm.vllm_host_info:
    image: vllm/vllm-openai:v0.32.0
    image_archive: /srv/share/vllm-openai-v0.32.0.tar
"""

RETURN = r"""
containers:
  description: For each of O(container_names), C(exists) and C(container) (C(docker inspect)'s object, or null).
  returned: always
  type: dict
  sample: {vllm: {exists: true, container: {Id: 3f2a..., State: {Running: true}}}, vllm-previous: {exists: false, container: null}}
images:
  description: C(docker image inspect)'s objects for O(image); empty when it is missing or O(image) is empty.
  returned: always
  type: list
  elements: dict
archive:
  description: When O(image) is missing and O(image_archive) is given, C(exists) and C(size) (bytes) of the archive.
  returned: when the image is missing and an archive is given
  type: dict
  sample: {exists: true, size: 3270000000}
docker_root_dir:
  description: Docker's data root (C(docker info)), where a load unpacks the archive.
  returned: when the image is missing and its archive exists
  type: str
  sample: /var/lib/docker
docker_root_free_bytes:
  description: Bytes free to unprivileged writers on the data root's filesystem (C(statvfs)).
  returned: when the image is missing and its archive exists
  type: int
port_listening:
  description: Whether something accepts TCP connections on O(port_host):O(port) (false when O(port) is 0).
  returned: always
  type: bool
deployment_records:
  description: >-
    The deployment's records parsed, null where a file does not exist - C(current) (what runs), C(previous) (what it
    replaced), C(marker) (an interrupted rollout's in-progress marker), and with
    O(deployment_records.rollback_target) C(rollback_target) (image, image_tag, image_digest, model, model_commit,
    served_model_name, version, args, env, gpu_uuids of the previous record, and kv_predicted, the KV prediction
    it was deployed with; null without one).
  returned: when O(deployment_records) is given
  type: dict
  sample: {current: {image: "vllm/vllm-openai:v0.32.0@sha256:...", port: 8000}, previous: null, marker: null}
paths:
  description: Each of O(paths) and whether it exists.
  returned: always
  type: dict
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_record, docker_inspect


def _inspect(module, docker, argv):
    rc, out, err = module.run_command([docker] + argv)
    try:
        return docker_inspect.found_objects(rc, out, err)
    except docker_inspect.InspectError as exc:
        module.fail_json(msg="%s: %s" % (" ".join(["docker"] + argv[:2]), exc))


def _port_listening(host, port):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _deployment_records(module, wanted):
    try:
        records = deployment_record.read_all(wanted["config_dir"], wanted["name"])
        if wanted["rollback_target"]:
            records["rollback_target"] = (deployment_record.rollback_target(records["previous"])
                                          if records["previous"] is not None else None)
    except deployment_record.RecordError as exc:
        module.fail_json(msg=str(exc))
    return records


def main():
    module = AnsibleModule(
        argument_spec=dict(
            container_names=dict(type="list", elements="str", default=[]),
            image=dict(type="str", default=""),
            image_archive=dict(type="str", default=""),
            port=dict(type="int", default=0),
            port_host=dict(type="str", default="127.0.0.1"),
            deployment_records=dict(type="dict", options=dict(config_dir=dict(type="path", required=True),
                                                              name=dict(type="str", required=True),
                                                              rollback_target=dict(type="bool", default=False))),
            paths=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, containers={}, images=[], port_listening=False,
                  paths={path: os.path.exists(path) for path in p["paths"]})
    if p["deployment_records"]:
        result["deployment_records"] = _deployment_records(module, p["deployment_records"])
    docker = module.get_bin_path("docker", required=True) if p["container_names"] or p["image"] else None
    if p["container_names"]:
        found = _inspect(module, docker, ["inspect", "--type", "container"] + p["container_names"])
        result["containers"] = docker_inspect.containers_by_name(found, p["container_names"])
    if p["image"]:
        result["images"] = _inspect(module, docker, ["image", "inspect", p["image"]])
        if not result["images"] and p["image_archive"]:
            exists = os.path.isfile(p["image_archive"])
            result["archive"] = dict(exists=exists, size=os.path.getsize(p["image_archive"]) if exists else 0)
            if exists:
                _rc, out, _err = module.run_command([docker, "info", "--format", "{{.DockerRootDir}}"], check_rc=True)
                root = out.strip()
                stat = os.statvfs(root)
                result.update(docker_root_dir=root, docker_root_free_bytes=stat.f_bavail * stat.f_frsize)
    if p["port"]:
        result["port_listening"] = _port_listening(p["port_host"], p["port"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
