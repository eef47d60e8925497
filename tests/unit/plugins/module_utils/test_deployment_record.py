# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment records' layout, reading, writing and the rollback target, on real files."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_record as dr

RECORD = {"container_name": "chat", "image": "vllm/vllm-openai:v0.32.0@sha256:" + "b" * 64, "model": "Qwen/Qwen3-8B",
          "model_revision": "c" * 40, "served_model_name": "qwen3", "version": "v0.32.0",
          "args": ["--port", "8000", "--served-model-name", "qwen3"], "env": {"HF_HUB_OFFLINE": "1"},
          "gpu_uuids": ["GPU-1"], "bind_address": "0.0.0.0", "port": 8000}


def test_the_three_files_are_named_by_the_container():
    assert dr.paths("/etc/onprem-vllm", "chat") == {
        "current": "/etc/onprem-vllm/chat.deployment.json",
        "previous": "/etc/onprem-vllm/chat.deployment.previous.json",
        "marker": "/etc/onprem-vllm/chat.rollout.json"}
    for bad in ("", "../etc/passwd", "a/b"):
        with pytest.raises(dr.RecordError, match="cannot name a record file"):
            dr.paths("/etc/onprem-vllm", bad)


def test_dumps_is_ansible_s_to_nice_json_layout():
    # Files written by to_nice_json read back as unchanged: a collection upgrade rewrites no record.
    from ansible.plugins.filter.core import to_nice_json
    assert dr.dumps(RECORD) == to_nice_json(RECORD) + "\n"
    assert dr.dumps({"a": "ü"}) == '{\n    "a": "ü"\n}\n'


def test_read_all_missing_files_are_none_and_broken_ones_fail_with_their_path(tmp_path):
    assert dr.read_all(str(tmp_path), "chat") == {"current": None, "previous": None, "marker": None}
    (tmp_path / "chat.deployment.json").write_text(json.dumps(RECORD))
    assert dr.read_all(str(tmp_path), "chat")["current"] == RECORD
    (tmp_path / "chat.rollout.json").write_text("{half")
    with pytest.raises(dr.RecordError, match="cannot read .*chat.rollout.json as JSON"):
        dr.read_all(str(tmp_path), "chat")


def test_passed_writes_take_the_replaced_record_from_the_marker(tmp_path):
    new, old = dict(RECORD, version="v0.33.0"), RECORD
    files = dr.paths(str(tmp_path), "chat")
    pending = dr.marker(new, old, "id-1")
    assert pending == {"new": new, "replaced": old, "deployment": "id-1"}
    # From the marker alone (reconcile after a kill): previous first, then current.
    assert dr.passed_writes(str(tmp_path), "chat", pending) == [(files["previous"], dr.dumps(old)),
                                                                (files["current"], dr.dumps(new))]
    # The deploy's own write: the given record (with its KV check) as current.
    current = dict(new, kv_cache={"actual": 1})
    assert dr.passed_writes(str(tmp_path), "chat", pending, current)[-1] == (files["current"], dr.dumps(current))
    # A first deployment replaced nothing; an unchanged server has no marker: current only.
    assert dr.passed_writes(str(tmp_path), "chat", dr.marker(new, None, "id-2")) == [(files["current"], dr.dumps(new))]
    assert dr.passed_writes(str(tmp_path), "chat", None, new) == [(files["current"], dr.dumps(new))]
    with pytest.raises(dr.RecordError, match="no in-progress marker"):
        dr.passed_writes(str(tmp_path), "chat", None)
    with pytest.raises(dr.RecordError, match="needs the new deployment's id"):
        dr.marker(new, None, "")


def test_write_is_atomic_0600_and_only_where_it_differs(tmp_path):
    path = str(tmp_path / "chat.deployment.json")
    assert dr.write(path, "x\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and open(path).read() == "x\n"
    assert not dr.write(path, "x\n")
    os.chmod(path, 0o644)
    assert dr.write(path, "x\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert dr.write(path, "y\n") and open(path).read() == "y\n"
    assert os.listdir(tmp_path) == ["chat.deployment.json"]  # no temporary file left


def test_rollback_target_splits_the_image_and_keeps_what_ran():
    target = dr.rollback_target(RECORD)
    assert target == {"image": "vllm/vllm-openai", "image_tag": "v0.32.0", "image_digest": "sha256:" + "b" * 64,
                      "model": "Qwen/Qwen3-8B", "model_commit": "c" * 40, "served_model_name": "qwen3",
                      "version": "v0.32.0", "args": RECORD["args"], "env": RECORD["env"], "gpu_uuids": ["GPU-1"],
                      "kv_predicted": {}}
    # The KV prediction the previous server was deployed with: the restored server, on the same arguments, is
    # compared with it.
    predicted = {"kv_cache_tokens": 68464, "num_gpu_blocks": 4279, "max_model_len": 4096}
    assert dr.rollback_target(dict(RECORD, kv_cache={"predicted": predicted, "actual": predicted}))[
        "kv_predicted"] == predicted
    # A registry with a port, no digest.
    target = dr.rollback_target(dict(RECORD, image="registry.lan:5000/vllm/vllm-openai:v0.26.0"))
    assert (target["image"], target["image_tag"], target["image_digest"]) == (
        "registry.lan:5000/vllm/vllm-openai", "v0.26.0", "")
    with pytest.raises(dr.RecordError, match="has no tag"):
        dr.rollback_target(dict(RECORD, image="registry.lan:5000/vllm/vllm-openai"))
    with pytest.raises(dr.RecordError, match="lacks served_model_name: it was not written by vllm_server"):
        dr.rollback_target({k: v for k, v in RECORD.items() if k != "served_model_name"})
