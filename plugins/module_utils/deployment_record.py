# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A deployment's records on its host: where they live, how they are read and written, what a rollback takes from them.

The only code that knows these files (the module vllm_deployment writes them; vllm_host_info reads them for the role,
rollback.yml and benchmark.yml). In the server's
config directory, for its container NAME:

- NAME.deployment.json: the deployment that runs and last passed its gate;
- NAME.deployment.previous.json: the deployment it replaced (rollback.yml restores it);
- NAME.answers.json: the known-answer gate's recorded answers (module_utils/known_answers.py) for the model,
  revision and dtype that last recorded them;
- NAME.rollout.json: the in-progress marker, written before a running server is set aside and removed once the new
  one passed its gate: {"new": the new deployment's record, "replaced": the record it replaces (null in a first
  deployment), "deployment": the id the new container carries as its label onprem.vllm.deployment}.

Each file is written whole through a temporary file renamed over it, so a power cut leaves the old file or the new one.
"""
from __future__ import annotations

import json
import os
import tempfile

MODE = 0o600
# What a rollback restores: the keys vllm_server's prepare.yml puts in every record.
ROLLBACK_KEYS = ("image", "model", "model_revision", "served_model_name", "version", "args", "env", "gpu_uuids")


class RecordError(ValueError):
    """A record that cannot be read, or lacks what is asked of it."""


def paths(config_dir: str, name: str) -> dict:
    """The three files of the deployment whose container is NAME, by kind."""
    if not name or "/" in name:
        raise RecordError(f"container name {name!r} cannot name a record file")
    base = os.path.join(config_dir, name)
    return {"current": base + ".deployment.json", "previous": base + ".deployment.previous.json",
            "marker": base + ".rollout.json"}


def answers_path(config_dir: str, name: str) -> str:
    """The known-answer gate's recorded answers of the deployment whose container is NAME."""
    return paths(config_dir, name)["current"].replace(".deployment.json", ".answers.json")


def dumps(record) -> str:
    """A record as its file holds it (Ansible's to_nice_json layout, so files written before read the same)."""
    return json.dumps(record, indent=4, sort_keys=True, ensure_ascii=False) + "\n"


def read(path: str):
    """The parsed file, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read {path} as JSON: {exc}") from None


def read_all(config_dir: str, name: str) -> dict:
    """Each of the deployment's files parsed (None where it does not exist), by kind."""
    return {kind: read(path) for kind, path in paths(config_dir, name).items()}


def marker(new: dict, replaced, deployment_id: str) -> dict:
    """The in-progress marker's content."""
    if not deployment_id:
        raise RecordError("the in-progress marker needs the new deployment's id")
    return {"new": new, "replaced": replaced, "deployment": deployment_id}


def passed_writes(config_dir: str, name: str, pending, current=None) -> list:
    """(path, content) to write once a server passed its gate: the record it replaced as previous (from the marker,
    when there is one and it replaced a deployment), then CURRENT, else the marker's new record, as current."""
    files = paths(config_dir, name)
    if current is None:
        if not pending:
            raise RecordError(f"no record to write for {name}: no in-progress marker at {files['marker']} and none given")
        current = pending["new"]
    writes = []
    if pending and pending.get("replaced") is not None:
        writes.append((files["previous"], dumps(pending["replaced"])))
    writes.append((files["current"], dumps(current)))
    return writes


def rollback_target(previous: dict, source: str = "the previous record") -> dict:
    """What rollback.yml deploys again from a previous record: the image split into repository, tag and digest, the
    model and its commit, the served name, the version, the exact arguments, environment and GPUs, and the KV
    prediction it was deployed with (its arguments pin the same pool, so the restored server is compared with it; {}
    where the record has none)."""
    missing = [key for key in ROLLBACK_KEYS if key not in previous]
    if missing:
        raise RecordError(f"{source} lacks {', '.join(missing)}: it was not written by vllm_server")
    reference, _at, digest = previous["image"].partition("@")
    repository, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        raise RecordError(f"{source}'s image {previous['image']!r} has no tag")
    return {"image": repository, "image_tag": tag, "image_digest": digest, "model": previous["model"],
            "model_commit": previous["model_revision"], "served_model_name": previous["served_model_name"],
            "version": previous["version"], "args": previous["args"], "env": previous["env"],
            "gpu_uuids": previous["gpu_uuids"], "kv_predicted": (previous.get("kv_cache") or {}).get("predicted") or {}}


def write(path: str, content: str) -> bool:
    """Write the file (mode 0600) where its content differs, atomically; True when it was written."""
    wanted = content.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            if handle.read() == wanted:
                if os.stat(path).st_mode & 0o777 == MODE:
                    return False
                os.chmod(path, MODE)
                return True
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), MODE)
            handle.write(wanted)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _sync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def _sync_directory(directory: str) -> None:
    """Make a rename or unlink in DIRECTORY durable: without it a power cut can undo the step after the file's fsync."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    """Remove the file durably; True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    _sync_directory(os.path.dirname(path))
    return True
