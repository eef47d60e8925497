# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's facts read from the model itself: its commit, its config.json, its files' sizes and its weights' size.

Three places hold a model: an HF cache folder (models--ORG--NAME with refs/, snapshots/, blobs/: the host's cache once
staged, or a folder in that layout), a tarball of that folder (what hf_cache stages from on an air-gapped site), and
the hub (its API lists a revision's files with their sizes; config.json and the safetensors index are small files).
Every reader returns the same ModelFacts, so the plan does not care where the facts came from.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import tarfile
from urllib.parse import quote

from ansible_collections.onprem.vllm.plugins.module_utils.model_config import (
    ModelConfigError,
    checkpoint_weight_bytes,
    safetensors_tensor_bytes,
)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
INDEX_NAME = "model.safetensors.index.json"
# The largest config.json or safetensors index read: real ones are KBs (an index of a 1 T model is ~2 MB).
MAX_SMALL_FILE_BYTES = 16 * 1024 * 1024


class ModelSourceError(Exception):
    """The model is not where its source says, or not at that revision."""


def repo_folder(model):
    """The HF cache folder name of a model id: Org/Name -> models--Org--Name."""
    return "models--" + model.replace("/", "--")


def weight_bytes_from(sizes, index):
    """The weights' size: the safetensors index's total_size, else the sum of the .safetensors files, else None."""
    total = ((index or {}).get("metadata") or {}).get("total_size") if isinstance(index, dict) else None
    if isinstance(total, int) and total > 0:
        return total
    weights = [size for name, size in sizes.items() if name.endswith(".safetensors")]
    return sum(weights) if weights else None


def facts(commit, config, sizes, weight_bytes, origin):
    """The facts every source returns (what the plan reads: quantization and dtype come from the config)."""
    if not isinstance(config, dict):
        raise ModelSourceError("%s: config.json is not a JSON object" % origin)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    return {
        "commit": commit,
        "config": config,
        "files": len(sizes),
        "size_bytes": sum(sizes.values()),
        "weight_bytes": weight_bytes,
        "quantization": str(quant.get("quant_method") or "") if isinstance(quant, dict) else "",
        "dtype": str(config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype") or ""),
        "origin": origin,
    }


def _read_json(handle, what):
    data = handle.read(MAX_SMALL_FILE_BYTES + 1)
    if len(data) > MAX_SMALL_FILE_BYTES:
        raise ModelSourceError("%s is larger than %d bytes: not a config" % (what, MAX_SMALL_FILE_BYTES))
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except ValueError as exc:
        raise ModelSourceError("%s is not JSON: %s" % (what, exc))


def _branch_hint(revision):
    return ("" if COMMIT_RE.match(revision) else
            " (a branch or tag is resolved through refs/%s, which this source does not hold: pin the 40-hex commit)"
            % revision)


def cached_revision(repo_path, revision):
    """(commit, staged) of a revision in an HF cache folder on this machine: a branch or tag resolves through refs/
    (commit empty where the ref is missing); staged when the commit's snapshot has its config.json."""
    commit = revision
    if not COMMIT_RE.match(revision):
        try:
            with open(os.path.join(repo_path, "refs", revision), "r") as handle:
                commit = handle.read().strip()
        except (IOError, OSError):
            return "", False
        if not COMMIT_RE.match(commit):
            return "", False
    return commit, os.path.isfile(os.path.join(repo_path, "snapshots", commit, "config.json"))


def from_cache_folder(repo_path, revision):
    """Facts of one revision in an HF cache folder (models--ORG--NAME) on this machine."""
    if not os.path.isdir(repo_path):
        raise ModelSourceError("%s is not a folder" % repo_path)
    commit = revision
    if not COMMIT_RE.match(revision):
        ref = os.path.join(repo_path, "refs", revision)
        if not os.path.isfile(ref):
            raise ModelSourceError("%s has no snapshot of %s%s" % (repo_path, revision, _branch_hint(revision)))
        with open(ref, "r") as handle:
            commit = handle.read().strip()
    snapshot = os.path.join(repo_path, "snapshots", commit)
    config_path = os.path.join(snapshot, "config.json")
    if not os.path.isfile(config_path):
        raise ModelSourceError("%s has no config.json in snapshot %s" % (repo_path, commit))
    with open(config_path, "rb") as handle:
        config = _read_json(handle, config_path)
    sizes = {}
    for folder, _dirs, names in os.walk(snapshot):
        for name in names:
            path = os.path.join(folder, name)
            sizes[os.path.relpath(path, snapshot)] = os.stat(path).st_size  # follows the snapshot's links to blobs
    try:
        weight_bytes = checkpoint_weight_bytes(snapshot)
    except (ModelConfigError, ValueError) as exc:
        raise ModelSourceError(str(exc))
    return facts(commit, config, sizes, weight_bytes, "%s (snapshot %s)" % (repo_path, commit))


def from_archive(archive_path, model, revision):
    """Facts of one revision in a tarball of the models--ORG--NAME folder (read in place; nothing is unpacked)."""
    if not os.path.isfile(archive_path):
        raise ModelSourceError("the archive %s is not a file" % archive_path)
    folder = repo_folder(model)
    try:
        archive = tarfile.open(archive_path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise ModelSourceError("cannot read the archive %s: %s" % (archive_path, exc))
    with archive:
        members = {}
        for member in archive.getmembers():
            name = posixpath.normpath(member.name)  # "./models--X/..." and "models--X/..." alike
            members[name] = member
        prefix = next((p for p in (folder, "hub/" + folder) if p in members or any(
            n.startswith(p + "/") for n in members)), None)
        if prefix is None:
            raise ModelSourceError("the archive %s holds no %s folder (it must be a tarball of the model's HF cache "
                                   "folder)" % (archive_path, folder))

        def read(name, what):
            member = members.get(name)
            if member is None:
                return None
            handle = archive.extractfile(member)  # resolves the snapshot's links to blobs inside the archive
            if handle is None:
                return None
            with handle:
                return _read_json(handle, "%s in %s" % (what, archive_path))

        commit = revision
        if not COMMIT_RE.match(revision):
            ref = members.get("%s/refs/%s" % (prefix, revision))
            if ref is None or not ref.isfile():
                raise ModelSourceError("the archive %s has no snapshot of %s%s"
                                       % (archive_path, revision, _branch_hint(revision)))
            commit = archive.extractfile(ref).read().decode("ascii", "replace").strip()
        snapshot = "%s/snapshots/%s" % (prefix, commit)
        config = read(snapshot + "/config.json", "config.json")
        if config is None:
            raise ModelSourceError("the archive %s has no config.json in snapshot %s of %s"
                                   % (archive_path, commit, model))
        sizes, targets = {}, {}
        for name, member in members.items():
            if not name.startswith(snapshot + "/") or member.isdir():
                continue
            target = member
            if member.issym() or member.islnk():
                link = (posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
                        if member.issym() else posixpath.normpath(member.linkname))
                target = members.get(link, member)
            sizes[name[len(snapshot) + 1:]] = target.size
            targets[name[len(snapshot) + 1:]] = target
        index = read(snapshot + "/" + INDEX_NAME, INDEX_NAME)
        weight_bytes = weight_bytes_from({}, index)
        if weight_bytes is None:
            # As from a cache folder: the tensors' bytes from each safetensors header (a file also holds its header).
            weights = [n for n in sorted(targets) if n.endswith(".safetensors") and targets[n].isfile()]
            weight_bytes = sum(_tensor_bytes(archive, targets[n], "%s/%s in %s" % (snapshot, n, archive_path))
                               for n in weights) if weights else None
    return facts(commit, config, sizes, weight_bytes, "%s (snapshot %s)" % (archive_path, commit))


def _tensor_bytes(archive, member, what):
    with archive.extractfile(member) as handle:
        try:
            return safetensors_tensor_bytes(handle, what)
        except (ModelConfigError, ValueError) as exc:
            raise ModelSourceError(str(exc))


def hub_info_url(endpoint, model, revision):
    """The hub API's answer on one revision: its commit (sha) and every file with its size (blobs=true)."""
    return "%s/api/models/%s/revision/%s?blobs=true" % (endpoint.rstrip("/"), model, quote(revision, safe=""))


def hub_file_url(endpoint, model, commit, name):
    return "%s/%s/resolve/%s/%s" % (endpoint.rstrip("/"), model, commit, name)


def from_hub(fetch_json, endpoint, model, revision):
    """Facts of one revision on the hub. fetch_json(url) returns the parsed JSON of a GET (the caller adds the token)."""
    info = fetch_json(hub_info_url(endpoint, model, revision))
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not COMMIT_RE.match(commit):
        raise ModelSourceError("the hub's answer on %s at %s has no commit sha" % (model, revision))
    sizes = {}
    for sibling in info.get("siblings") or []:
        if isinstance(sibling, dict) and isinstance(sibling.get("rfilename"), str):
            sizes[sibling["rfilename"]] = int(sibling.get("size") or 0)
    if "config.json" not in sizes:
        raise ModelSourceError("%s at %s (commit %s) has no config.json on the hub" % (model, revision, commit))
    config = fetch_json(hub_file_url(endpoint, model, commit, "config.json"))
    index = fetch_json(hub_file_url(endpoint, model, commit, INDEX_NAME)) if INDEX_NAME in sizes else None
    return facts(commit, config, sizes, weight_bytes_from(sizes, index),
                 "%s %s (commit %s)" % (endpoint.rstrip("/"), model, commit))
