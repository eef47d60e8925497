# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_deployment_record module on real files: a deployment's life (marker, passed, finished), a replacement
that keeps the record it replaced, a reconcile from the marker alone, check mode, and the errors."""
from __future__ import annotations

import json

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_deployment_record

OLD = {"image": "vllm/vllm-openai:v0.32.0", "version": "v0.32.0", "port": 8000}
NEW = {"image": "vllm/vllm-openai:v0.33.0", "version": "v0.33.0", "port": 8000}


@pytest.fixture
def record(call_module, tmp_path):
    return lambda **args: call_module(vllm_deployment_record, config_dir=str(tmp_path), name="chat", **args)


def files(tmp_path):
    return {p.name: json.loads(p.read_text()) for p in sorted(tmp_path.iterdir())}


def test_a_first_deployment_then_a_replacement(record, tmp_path):
    rc, result = record(state="started", record=OLD, deployment_id="id-old")
    assert rc == 0 and result["changed"] and files(tmp_path) == {
        "chat.rollout.json": {"new": OLD, "replaced": None, "deployment": "id-old"}}
    rc, result = record(state="passed", record=dict(OLD, kv_cache={"actual": 1}))
    assert result["changed_paths"] == [str(tmp_path / "chat.deployment.json")]
    assert record(state="finished")[1]["changed"] is True
    assert files(tmp_path) == {"chat.deployment.json": dict(OLD, kv_cache={"actual": 1})}
    # The same again (an unchanged server's run): nothing changes.
    assert record(state="passed", record=dict(OLD, kv_cache={"actual": 1}))[1]["changed"] is False
    assert record(state="finished")[1]["changed"] is False

    # The replacement: the marker holds the record it replaces; passed keeps it as previous.
    record(state="started", record=NEW, deployment_id="id-new", replaces=True)
    assert files(tmp_path)["chat.rollout.json"]["replaced"] == dict(OLD, kv_cache={"actual": 1})
    record(state="passed", record=NEW)
    record(state="finished")
    assert files(tmp_path) == {"chat.deployment.json": NEW, "chat.deployment.previous.json": dict(OLD, kv_cache={"actual": 1})}


def test_reconcile_finishes_the_records_from_the_marker_alone(record, tmp_path):
    (tmp_path / "chat.deployment.json").write_text(json.dumps(OLD))
    record(state="started", record=NEW, deployment_id="id-new", replaces=True)
    rc, result = record(state="passed")  # no record given: the marker's new one
    assert rc == 0 and result["changed_paths"] == [str(tmp_path / "chat.deployment.previous.json"),
                                                   str(tmp_path / "chat.deployment.json")]
    assert files(tmp_path)["chat.deployment.json"] == NEW and files(tmp_path)["chat.deployment.previous.json"] == OLD


def test_check_mode_reports_and_writes_nothing(record, tmp_path):
    rc, result = record(state="passed", record=NEW, _ansible_check_mode=True)
    assert rc == 0 and result["changed"] and list(tmp_path.iterdir()) == []
    (tmp_path / "chat.rollout.json").write_text("{}")
    rc, result = record(state="finished", _ansible_check_mode=True)
    assert result["changed"] and (tmp_path / "chat.rollout.json").exists()


def test_errors_name_what_is_missing(record, call_module, tmp_path):
    rc, result = record(state="passed")
    assert rc == 1 and "no in-progress marker" in result["msg"]
    rc, result = record(state="started", record=NEW)
    assert rc == 1 and "needs the new deployment's id" in result["msg"]
    rc, result = call_module(vllm_deployment_record, config_dir=str(tmp_path / "absent"), name="chat", state="finished")
    assert rc == 1 and "must exist" in result["msg"]
