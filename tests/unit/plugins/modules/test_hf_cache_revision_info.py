# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hf_cache role's one read of a host's cache: where the model's folder is, the commit a branch resolves to,
whether it is staged, and its facts read there."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.onprem.vllm.plugins.modules import hf_cache_revision_info

MODEL = "Org/Tiny"
COMMIT = "a" * 40
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16"}


def make_cache(hub):
    """A cache folder as a staging leaves it (plain files here; test_hf_model_source covers blobs and links)."""
    repo = hub / "models--Org--Tiny"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT + "\n")
    files = {"config.json": json.dumps(CONFIG), "tokenizer.json": "{}"}
    for name, content in files.items():
        (snapshot / name).write_text(content)
    return repo, {name: len(content) for name, content in files.items()}


@pytest.fixture
def call(call_module):
    return lambda **args: call_module(hf_cache_revision_info, **args)


def test_a_staged_branch_resolves_and_its_facts_are_read(call, tmp_path):
    repo, sizes = make_cache(tmp_path / "hub")
    rc, out = call(path=str(tmp_path), model=MODEL, revision="main", read_facts=True)
    assert rc == 0, out
    assert (out["repo_path"], out["commit"], out["staged"], out["changed"]) == (str(repo), COMMIT, True, False)
    assert out["model_info"]["config"] == CONFIG and out["model_info"]["size_bytes"] == sum(sizes.values())


def test_facts_only_when_asked_and_staged(call, tmp_path):
    make_cache(tmp_path / "hub")
    assert call(path=str(tmp_path), model=MODEL, revision="main")[1]["model_info"] == {}
    rc, out = call(path=str(tmp_path), model=MODEL, revision="b" * 40, read_facts=True)
    assert rc == 0 and (out["commit"], out["staged"], out["model_info"]) == ("b" * 40, False, {})


def test_an_empty_cache(call, tmp_path):
    rc, out = call(path=str(tmp_path / "nothing"), model=MODEL, revision="main", read_facts=True)
    assert rc == 0 and (out["commit"], out["staged"]) == ("", False)
    assert out["repo_path"] == os.path.join(str(tmp_path / "nothing"), "hub", "models--Org--Tiny")


def test_a_staged_snapshot_that_cannot_be_read_is_named(call, tmp_path):
    repo, _sizes = make_cache(tmp_path / "hub")
    (repo / "snapshots" / COMMIT / "config.json").unlink()
    (repo / "snapshots" / COMMIT / "config.json").write_text("{not json")
    rc, out = call(path=str(tmp_path), model=MODEL, revision="main", read_facts=True)
    assert rc != 0 and "config.json is not JSON" in out["msg"]
