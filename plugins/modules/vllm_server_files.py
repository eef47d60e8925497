#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_server_files
short_description: Write in one call the small files a vLLM deployment keeps on its host
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - One module run instead of one task per file, since each task is a round trip to the host and a rollout writes these
    for every host it deploys (vllm_server's C(host_files.yml)).
  - In this order, each only where it differs, owned by O(owner) and O(group) - O(directories) are created (as listed,
    with any missing parent), O(files) are written with exactly their content (a temporary file in the same directory, then
    renamed over the old one, so a reader or a power cut never sees half a file), O(absent) paths are removed.
  - File contents are never returned, logged or diffed (one of them may be an API key).
options:
  directories:
    description: Directories to create, in order, with their mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      mode:
        description: Octal mode as a string, like C("0700").
        type: str
        required: true
  files:
    description: Files to write, with their whole content and mode. Their directory must exist (or be in O(directories)).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The file's whole content (never logged).
        type: str
        required: true
      mode:
        description: Octal mode as a string, like C("0600").
        type: str
        required: true
      fingerprint:
        description: Whether the file counts in RV(fingerprint) (false for a file the running process reads again
          itself, such as an API key file).
        type: bool
        default: true
  absent:
    description: Files to remove, by absolute path (a missing one is left as it is).
    type: list
    elements: path
    default: []
  owner:
    description: Owner of what is created or written; empty keeps the user the module runs as.
    type: str
    default: ""
  group:
    description: Group of what is created or written; empty keeps the user's group.
    type: str
    default: ""
  fingerprint_salt_file:
    description:
      - Where the host keeps a random salt (created 0600 on first use; empty, no fingerprint). The module then returns
        RV(fingerprint), an HMAC-SHA256 under that salt of the paths and contents of O(files) (those whose
        O(files[].fingerprint) is true), as wanted.
      - A container label can carry it, so a changed file the process reads at startup only (its code) redeploys the
        container even after a run that wrote the file was interrupted, and the label says nothing about the content
        to whoever reads it.
    type: path
    default: ""
notes:
  - Check mode is supported.
attributes:
  check_mode:
    description: Reports what would change and changes nothing.
    support: full
  diff_mode:
    description: Returns no diff; a file may hold a secret.
    support: none
"""

EXAMPLES = r"""
- name: The server's directories, API key file and middleware, and a file it no longer uses removed
  onprem.vllm.vllm_server_files:
    directories:
      - {path: /etc/onprem-vllm, mode: "0700"}
      - {path: /etc/onprem-vllm/middleware, mode: "0755"}
      - {path: /etc/onprem-vllm/vllm.secrets, mode: "0700"}
    files:
      - {path: /etc/onprem-vllm/vllm.secrets/api-key, content: "{{ vllm_server_api_key }}\n", mode: "0600", fingerprint: false}
      - {path: /etc/onprem-vllm/middleware/onprem_vllm_auth.py, content: "{{ middleware_source }}", mode: "0644"}
    absent: [/etc/onprem-vllm/other.secrets/api-key]
    owner: root
    group: root
  register: server_files
"""

RETURN = r"""
changed_paths:
  description: The paths created, written, re-moded, re-owned or removed (or that would be, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/onprem-vllm/vllm.secrets/api-key]
fingerprint:
  description: HMAC-SHA256 (hex) of O(files) under the host's salt; empty without O(fingerprint_salt_file), or in check
    mode before the salt exists.
  returned: always
  type: str
  sample: 3f2a...
"""

import hashlib
import hmac
import os
import secrets
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes


def _attributes(module, path, mode):
    """The file arguments AnsibleModule's attribute helpers take, for one path."""
    return module.load_file_common_arguments(
        dict(path=path, mode=mode, owner=module.params["owner"] or None, group=module.params["group"] or None))


def _ensure_directory(module, path, mode):
    """Create the directory and any missing parent (each with this mode and owner, as ansible.builtin.file does), or
    fix its attributes; True when something changed."""
    if os.path.isdir(path):
        return module.set_fs_attributes_if_different(_attributes(module, path, mode), False)
    if os.path.lexists(path):
        module.fail_json(msg="%s exists and is not a directory" % path)
    if not module.check_mode:
        missing = []
        current = path
        while not os.path.isdir(current):
            missing.insert(0, current)
            current = os.path.dirname(current)
        for directory in missing:
            try:
                os.mkdir(directory, int(mode, 8))
            except OSError as exc:
                module.fail_json(msg="cannot create %s: %s" % (directory, exc))
            module.set_fs_attributes_if_different(_attributes(module, directory, mode), True)
    return True


def _current_content(module, path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        module.fail_json(msg="cannot read %s: %s" % (path, exc))


def _ensure_file(module, path, content, mode):
    """Write the file where its content differs (atomically), then its attributes; True when something changed."""
    wanted = to_bytes(content, errors="surrogate_or_strict")
    if _current_content(module, path) == wanted:
        return module.set_fs_attributes_if_different(_attributes(module, path, mode), False)
    if module.check_mode:
        return True
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="cannot write %s: its directory %s does not exist" % (path, directory))
    # mkstemp creates it 0600 and it gets its own mode before the content: a key never sits in a wider mode.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), int(mode, 8))
            handle.write(wanted)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        module.fail_json(msg="cannot write %s: %s" % (path, exc))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    module.set_fs_attributes_if_different(_attributes(module, path, mode), True)
    return True


def _ensure_absent(module, path):
    if not os.path.lexists(path):
        return False
    if os.path.isdir(path) and not os.path.islink(path):
        module.fail_json(msg="%s is a directory: this module removes files only" % path)
    if not module.check_mode:
        try:
            os.unlink(path)
        except OSError as exc:
            module.fail_json(msg="cannot remove %s: %s" % (path, exc))
    return True


def _fingerprint(module, salt_file, files, changed_paths):
    """HMAC-SHA256 of the files' paths and wanted contents under the host's salt, created on first use."""
    salt = _current_content(module, salt_file)
    if salt is None:
        changed_paths.append(salt_file)
        if module.check_mode:
            return ""
        _ensure_file(module, salt_file, secrets.token_hex(32) + "\n", "0600")
        salt = _current_content(module, salt_file)
    digest = hmac.new(salt.strip(), digestmod=hashlib.sha256)
    for item in files:
        if not item["fingerprint"]:
            continue
        for part in (item["path"], item["content"]):
            data = to_bytes(part, errors="surrogate_or_strict")
            digest.update(b"%d:" % len(data) + data)
    return digest.hexdigest()


def main():
    path_and_mode = dict(path=dict(type="path", required=True), mode=dict(type="str", required=True))
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[], options=path_and_mode),
            files=dict(type="list", elements="dict", default=[],
                       options=dict(path_and_mode, content=dict(type="str", required=True, no_log=True),
                                    fingerprint=dict(type="bool", default=True))),
            absent=dict(type="list", elements="path", default=[]),
            owner=dict(type="str", default=""),
            group=dict(type="str", default=""),
            fingerprint_salt_file=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for path in [item["path"] for item in p["directories"] + p["files"]] + p["absent"] + [p["fingerprint_salt_file"] or "/"]:
        if not os.path.isabs(path):
            module.fail_json(msg="%s is not an absolute path" % path)
    for item in p["directories"] + p["files"]:
        try:
            int(item["mode"], 8)
        except ValueError:
            module.fail_json(msg="mode %r of %s is not an octal mode like \"0600\"" % (item["mode"], item["path"]))
    changed_paths = []
    for item in p["directories"]:
        if _ensure_directory(module, item["path"], item["mode"]):
            changed_paths.append(item["path"])
    for item in p["files"]:
        if _ensure_file(module, item["path"], item["content"], item["mode"]):
            changed_paths.append(item["path"])
    for path in p["absent"]:
        if _ensure_absent(module, path):
            changed_paths.append(path)
    fingerprint = (_fingerprint(module, p["fingerprint_salt_file"], p["files"], changed_paths)
                   if p["fingerprint_salt_file"] else "")
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, fingerprint=fingerprint)


if __name__ == "__main__":
    main()
