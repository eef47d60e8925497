# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model's facts from an HF cache folder, a tarball of it and the hub's answers: the same facts from each."""
from __future__ import annotations

import io
import json
import os
import struct
import tarfile

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import hf_model_source as src

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")
MODEL = "Qwen/Qwen3-30B-A3B-FP8"
COMMIT = "a" * 40
with open(os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8", "config.json"), encoding="utf-8") as _handle:
    CONFIG = json.load(_handle)


def safetensors(tensor_bytes):
    """A safetensors file whose header declares tensor_bytes of data (the data itself is zeros)."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [tensor_bytes // 2], "data_offsets": [0, tensor_bytes]}})
    header = header.encode() + b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(tensor_bytes)


def make_cache(root, with_index=True, branch="main"):
    """An HF cache folder as hf download leaves it: blobs, a snapshot of links to them, refs/<branch>."""
    repo = root / src.repo_folder(MODEL)
    files = {"config.json": json.dumps(CONFIG).encode(), "model-00001.safetensors": safetensors(4096),
             "model-00002.safetensors": safetensors(2048), "tokenizer.json": b"{}"}
    if with_index:
        files[src.INDEX_NAME] = json.dumps({"metadata": {"total_size": 6144}, "weight_map": {}}).encode()
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / branch).write_text(COMMIT + "\n")
    for number, (name, content) in enumerate(sorted(files.items())):
        blob = repo / "blobs" / ("%040x" % number)
        blob.write_bytes(content)
        os.symlink(os.path.join("..", "..", "blobs", blob.name), snapshot / name)
    return repo, {name: len(content) for name, content in files.items()}


def test_cache_folder_by_commit_and_by_branch(tmp_path):
    repo, sizes = make_cache(tmp_path)
    for revision in (COMMIT, "main"):
        info = src.from_cache_folder(str(repo), revision)
        assert info["commit"] == COMMIT
        assert info["config"] == CONFIG
        assert info["size_bytes"] == sum(sizes.values())  # the blobs' sizes, not the links'
        assert info["files"] == len(sizes)
        assert info["weight_bytes"] == 6144
        assert info["quantization"] == "fp8"
        assert info["dtype"] == "bfloat16"


def test_cache_folder_weights_from_headers_without_an_index(tmp_path):
    repo, _sizes = make_cache(tmp_path, with_index=False)
    assert src.from_cache_folder(str(repo), COMMIT)["weight_bytes"] == 6144


def test_cache_folder_errors_name_what_is_missing(tmp_path):
    repo, _sizes = make_cache(tmp_path)
    with pytest.raises(src.ModelSourceError, match="no snapshot of v2.*pin the 40-hex commit"):
        src.from_cache_folder(str(repo), "v2")
    with pytest.raises(src.ModelSourceError, match="no config.json in snapshot " + "b" * 40):
        src.from_cache_folder(str(repo), "b" * 40)
    with pytest.raises(src.ModelSourceError, match="is not a folder"):
        src.from_cache_folder(str(tmp_path / "nowhere"), COMMIT)


@pytest.mark.parametrize("mode, prefix, with_index", [("w", "", True), ("w:gz", "./", True), ("w", "", False)])
def test_archive_read_in_place(tmp_path, mode, prefix, with_index):
    repo, _sizes = make_cache(tmp_path, with_index=with_index)
    archive = tmp_path / "model.tar"
    with tarfile.open(archive, mode) as tar:
        tar.add(repo, arcname=prefix + repo.name)
    for revision in (COMMIT, "main"):
        info = src.from_archive(str(archive), MODEL, revision)
        assert info == dict(src.from_cache_folder(str(repo), COMMIT), origin=info["origin"])
        assert str(archive) in info["origin"]
        assert info["weight_bytes"] == 6144  # the index's total, or the safetensors headers' tensor bytes


def test_a_broken_safetensors_file_is_named(tmp_path):
    repo, _sizes = make_cache(tmp_path, with_index=False)
    blob = os.path.realpath(repo / "snapshots" / COMMIT / "model-00002.safetensors")
    with open(blob, "wb") as handle:
        handle.write(b"1234")
    archive = tmp_path / "model.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(repo, arcname=repo.name)
    with pytest.raises(src.ModelSourceError, match="model-00002.safetensors.*not a safetensors file"):
        src.from_archive(str(archive), MODEL, COMMIT)
    with pytest.raises(src.ModelSourceError, match="model-00002.safetensors.*not a safetensors file"):
        src.from_cache_folder(str(repo), COMMIT)


def test_archive_errors(tmp_path):
    repo, _sizes = make_cache(tmp_path)
    archive = tmp_path / "other.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(repo, arcname="models--Other--Model")
    with pytest.raises(src.ModelSourceError, match="holds no models--Qwen--Qwen3-30B-A3B-FP8 folder"):
        src.from_archive(str(archive), MODEL, COMMIT)
    with pytest.raises(src.ModelSourceError, match="is not a file"):
        src.from_archive(str(tmp_path / "missing.tar"), MODEL, COMMIT)
    (tmp_path / "junk.tar").write_bytes(b"not a tarball")
    with pytest.raises(src.ModelSourceError, match="cannot read the archive"):
        src.from_archive(str(tmp_path / "junk.tar"), MODEL, COMMIT)
    with tarfile.open(tmp_path / "big.tar", "w") as tar:
        data = b"{" + b" " * src.MAX_SMALL_FILE_BYTES + b"}"
        member = tarfile.TarInfo("%s/snapshots/%s/config.json" % (src.repo_folder(MODEL), COMMIT))
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(src.ModelSourceError, match="larger than"):
        src.from_archive(str(tmp_path / "big.tar"), MODEL, COMMIT)


def hub(answers):
    """fetch_json over a dict of URL -> JSON: the hub's answers as its API gives them."""
    asked = []

    def fetch_json(url):
        asked.append(url)
        return answers[url]

    return fetch_json, asked


def test_hub_sizes_from_the_api_and_only_small_files_fetched():
    endpoint = "https://hub.example"
    info_url = "%s/api/models/%s/revision/main?blobs=true" % (endpoint, MODEL)
    base = "%s/%s/resolve/%s/" % (endpoint, MODEL, COMMIT)
    fetch, asked = hub({
        info_url: {"sha": COMMIT, "siblings": [
            {"rfilename": "config.json", "size": 900},
            {"rfilename": "model-00001.safetensors", "size": 5_000_000_000},
            {"rfilename": src.INDEX_NAME, "size": 40_000}]},
        base + "config.json": CONFIG,
        base + src.INDEX_NAME: {"metadata": {"total_size": 4_999_000_000}},
    })
    info = src.from_hub(fetch, endpoint + "/", MODEL, "main")
    assert info["commit"] == COMMIT
    assert info["size_bytes"] == 5_000_040_900
    assert info["weight_bytes"] == 4_999_000_000
    assert info["quantization"] == "fp8"
    assert asked == [info_url, base + "config.json", base + src.INDEX_NAME]


def test_hub_errors():
    fetch, _asked = hub({src.hub_info_url("https://h", MODEL, "main"): {"siblings": []}})
    with pytest.raises(src.ModelSourceError, match="no commit sha"):
        src.from_hub(fetch, "https://h", MODEL, "main")
    fetch, _asked = hub({src.hub_info_url("https://h", MODEL, "main"): {"sha": COMMIT, "siblings": []}})
    with pytest.raises(src.ModelSourceError, match="has no config.json on the hub"):
        src.from_hub(fetch, "https://h", MODEL, "main")


def test_weights_and_dtype_of_a_multimodal_config():
    config = {"text_config": {"dtype": "bfloat16", "quantization_config": {"quant_method": "awq"}}}
    info = src.facts(COMMIT, config, {"a.safetensors": 10, "b.safetensors": 5, "x.json": 1}, None, "here")
    assert (info["dtype"], info["quantization"], info["size_bytes"]) == ("bfloat16", "awq", 16)
    assert src.weight_bytes_from({"a.safetensors": 10, "b.safetensors": 5}, None) == 15
    assert src.weight_bytes_from({"a.bin": 10}, None) is None
    with pytest.raises(src.ModelSourceError, match="not a JSON object"):
        src.facts(COMMIT, [], {}, None, "here")


@pytest.mark.needs_lab_share
def test_the_lab_tarballs_give_the_facts_of_their_unpacked_seeds(lab_model_tarball):
    """Each of the lab share's real model tarballs (lab/build_artifacts.py: the tiny Qwen3, the fleet's embedding
    model and the vision-language one) read in place, by branch and by commit, gives what the unpacked copy of the
    same folder gives: what the fleet's plan check reads before a host staged the model."""
    share = os.path.join(os.path.dirname(lab_model_tarball), "..")
    with open(os.path.join(share, "manifest.json"), encoding="utf-8") as handle:
        models = json.load(handle)["models"]
    # model type and (the language model's) hidden size of each
    expected = {"onprem-lab/tiny-qwen3": ("qwen3", 256), "onprem-lab/tiny-embed": ("qwen3", 128),
                "onprem-lab/tiny-vl": ("qwen3_vl", 256)}
    assert set(expected) <= set(models)
    seen = {}
    for model, entry in models.items():
        tarball = os.path.join(share, entry["tar"])
        by_branch = src.from_archive(tarball, model, "main")
        assert by_branch["commit"] == entry["revision"]
        unpacked = src.from_cache_folder(os.path.join(share, entry["hf_seed"]), entry["revision"])
        assert by_branch == dict(unpacked, origin=by_branch["origin"])
        assert src.from_archive(tarball, model, entry["revision"]) == by_branch
        assert 0 < by_branch["weight_bytes"] < by_branch["size_bytes"]
        config = by_branch["config"]
        seen[model] = (config["model_type"], config.get("text_config", config)["hidden_size"])
    assert {model: seen[model] for model in expected} == expected


def test_cached_revision_by_commit_branch_and_missing_parts(tmp_path):
    repo, _sizes = make_cache(tmp_path)
    assert src.cached_revision(str(repo), COMMIT) == (COMMIT, True)
    assert src.cached_revision(str(repo), "main") == (COMMIT, True)
    # A branch never staged has no ref: no commit yet; a commit not staged is named but not staged.
    assert src.cached_revision(str(repo), "dev") == ("", False)
    assert src.cached_revision(str(repo), "b" * 40) == ("b" * 40, False)
    assert src.cached_revision(str(tmp_path / "absent"), "main") == ("", False)
    (repo / "refs" / "broken").write_text("not a commit\n")
    assert src.cached_revision(str(repo), "broken") == ("", False)
    os.unlink(repo / "snapshots" / COMMIT / "config.json")
    assert src.cached_revision(str(repo), "main") == (COMMIT, False)
