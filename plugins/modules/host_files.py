#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: host_files
short_description: Write in one call the small files a role keeps on a host
version_added: 0.1.0
author: onprem.vllm developers (@onprem)
description:
  - One module run instead of one task per file, since each task is a round trip to the host and every run of a role
    (a rollout for every host it deploys, the gateway, monitoring) writes these.
  - In this order, each only where it differs - O(directories) are created (as listed, with any missing parent),
    O(files) are written with exactly their content (a temporary file in the same directory, checked by its
    O(files[].validate) command, then renamed over the old one, so a reader or a power cut never sees half a file),
    O(absent) paths are removed. Each is owned by its own owner and group, else O(owner) and O(group).
  - File contents are never returned, logged or diffed (one of them may be a key).
  - Named C(vllm_server_files) before; that name still reaches this module.
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
      owner:
        description: Owner (name or id); empty takes O(owner).
        type: str
        default: ""
      group:
        description: Group (name or id); empty takes O(group).
        type: str
        default: ""
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
      owner:
        description: Owner (name or id); empty takes O(owner).
        type: str
        default: ""
      group:
        description: Group (name or id); empty takes O(group).
        type: str
        default: ""
      validate:
        description:
          - A command run on the new content before it replaces the file, C(%s) standing for the temporary file's path
            (as ansible.builtin.template's); the file is left as it was and the module fails, with the command's
            output, when the command fails. Run only when the content differs, and not in check mode.
        type: str
        default: ""
      secret:
        description: The content holds a secret, so a failed O(files[].validate) returns the command's exit status
          only, not its output (which may quote the content).
        type: bool
        default: false
      create_only:
        description: Write the content only where the file does not exist (its owner and mode are still kept); for a
          file another program owns the content of once it exists.
        type: bool
        default: false
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
    description: Owner of what is created or written without an owner of its own; empty keeps the user the module runs
      as.
    type: str
    default: ""
  group:
    description: Group of what is created or written without a group of its own; empty keeps the user's group.
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
    description: Reports what would change (RV(changed_paths)) and changes nothing.
    support: full
  diff_mode:
    description: Returns no diff; a file may hold a secret. RV(changed_paths) says what changed.
    support: none
"""
EXAMPLES = r"""
- name: The server's directories, API key file and middleware, and a file it no longer uses removed
  onprem.vllm.host_files:
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

- name: A configuration another group reads, checked before it replaces the old one
  onprem.vllm.host_files:
    files:
      - path: /etc/prometheus/alertmanager.yml
        content: "{{ lookup('ansible.builtin.template', 'alertmanager.yml.j2') }}"
        mode: "0640"
        group: prometheus
        validate: amtool check-config %s
    owner: root
    group: root
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
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_text


def _attributes(module, item):
    """The file arguments AnsibleModule's attribute helpers take, for one item (its owner and group, else the
    module's)."""
    return module.load_file_common_arguments(
        dict(path=item["path"], mode=item["mode"], owner=item.get("owner") or module.params["owner"] or None,
             group=item.get("group") or module.params["group"] or None))


def _ensure_directory(module, item):
    """Create the directory and any missing parent (each with this mode and owner, as ansible.builtin.file does), or
    fix its attributes; True when something changed."""
    path = item["path"]
    if os.path.isdir(path):
        return module.set_fs_attributes_if_different(_attributes(module, item), False)
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
                os.mkdir(directory, int(item["mode"], 8))
            except OSError as exc:
                module.fail_json(msg="cannot create %s: %s" % (directory, exc))
            module.set_fs_attributes_if_different(_attributes(module, dict(item, path=directory)), True)
    return True


def _current_content(module, path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        module.fail_json(msg="cannot read %s: %s" % (path, exc))


def _validate(module, item, candidate):
    """Run the item's validate command on the candidate file; fail (the old file untouched) when it fails."""
    if "%s" not in item["validate"]:
        module.fail_json(msg="validate of %s must contain %%s (the new file's path): %s" % (item["path"], item["validate"]))
    argv = [candidate if word == "%s" else word.replace("%s", candidate) for word in shlex.split(item["validate"])]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        output = ("its output is not shown, the file holds a secret" if item.get("secret")
                  else (to_text(err) or to_text(out)).strip()[-2000:])
        module.fail_json(msg="%s was not written: its new content failed %r (rc %d): %s"
                         % (item["path"], item["validate"], rc, output))


def _ensure_file(module, item):
    """Write the file where its content differs (atomically, validated first), then its attributes; True when
    something changed."""
    path = item["path"]
    wanted = to_bytes(item["content"], errors="surrogate_or_strict")
    current = _current_content(module, path)
    if current == wanted or (current is not None and item.get("create_only")):
        return module.set_fs_attributes_if_different(_attributes(module, item), False)
    if module.check_mode:
        return True
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        module.fail_json(msg="cannot write %s: its directory %s does not exist" % (path, directory))
    # mkstemp creates it 0600 and it gets its own mode before the content: a key never sits in a wider mode.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), int(item["mode"], 8))
            handle.write(wanted)
            handle.flush()
            os.fsync(handle.fileno())
        if item.get("validate"):
            _validate(module, item, tmp)
        module.set_fs_attributes_if_different(_attributes(module, dict(item, path=tmp)), True)
        os.replace(tmp, path)
    except OSError as exc:
        module.fail_json(msg="cannot write %s: %s" % (path, exc))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
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
        _ensure_file(module, dict(path=salt_file, content=secrets.token_hex(32) + "\n", mode="0600"))
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
    attributes = dict(path=dict(type="path", required=True), mode=dict(type="str", required=True),
                      owner=dict(type="str", default=""), group=dict(type="str", default=""))
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[], options=attributes),
            files=dict(type="list", elements="dict", default=[],
                       options=dict(attributes, content=dict(type="str", required=True, no_log=True),
                                    validate=dict(type="str", default=""),
                                    secret=dict(type="bool", default=False),
                                    create_only=dict(type="bool", default=False),
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
        if _ensure_directory(module, item):
            changed_paths.append(item["path"])
    for item in p["files"]:
        if _ensure_file(module, item):
            changed_paths.append(item["path"])
    for path in p["absent"]:
        if _ensure_absent(module, path):
            changed_paths.append(path)
    fingerprint = (_fingerprint(module, p["fingerprint_salt_file"], p["files"], changed_paths)
                   if p["fingerprint_salt_file"] else "")
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, fingerprint=fingerprint)


if __name__ == "__main__":
    main()
