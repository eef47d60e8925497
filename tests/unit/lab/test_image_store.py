# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab/image_store.py: hosts are seeded with hard links to the template's layers and their own image metadata, and a
data root already in use is never touched (the seed script runs here on a scratch folder laid out like Docker's)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "lab"))
SPEC = importlib.util.spec_from_file_location("image_store", os.path.join(ROOT, "lab", "image_store.py"))
image_store = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(image_store)


def make_template(volumes):
    data = volumes / "store" / "_data"
    (data / "overlay2" / "abc" / "diff" / "opt").mkdir(parents=True)
    (data / "overlay2" / "abc" / "diff" / "opt" / "lib.so").write_bytes(b"layer bytes")
    (data / "image" / "overlay2").mkdir(parents=True)
    (data / "image" / "overlay2" / "repositories.json").write_text('{"Repositories": {}}')
    (data / "engine-id").write_text("template-engine")  # per engine: must not travel
    (data / "network" / "files").mkdir(parents=True)
    (data / "network" / "files" / "local-kv.db").write_bytes(b"bolt")
    (volumes / "host1" / "_data").mkdir(parents=True)
    return data


def seed(volumes, target="host1"):
    script = image_store.seed_script(str(volumes), "store", target)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_layers_are_hard_links_and_metadata_is_a_copy(tmp_path):
    template = make_template(tmp_path)
    assert seed(tmp_path) == "seeded"
    host = tmp_path / "host1" / "_data"
    layer, seeded_layer = template / "overlay2/abc/diff/opt/lib.so", host / "overlay2/abc/diff/opt/lib.so"
    assert os.stat(layer).st_ino == os.stat(seeded_layer).st_ino
    repos, seeded_repos = template / "image/overlay2/repositories.json", host / "image/overlay2/repositories.json"
    assert seeded_repos.read_text() == repos.read_text()
    assert os.stat(repos).st_ino != os.stat(seeded_repos).st_ino
    assert sorted(p.name for p in host.iterdir()) == ["image", "overlay2"]  # no engine-id, no network database


def test_a_data_root_in_use_is_left_alone(tmp_path):
    make_template(tmp_path)
    own = tmp_path / "host1" / "_data" / "overlay2"
    own.mkdir()
    (own / "mine").write_text("the host's own layer")
    assert seed(tmp_path) == "in-use"
    assert sorted(p.name for p in own.iterdir()) == ["mine"]


def test_the_template_follows_both_images():
    key = image_store.store_key("sha256:base", "sha256:serving")
    assert key == image_store.store_key("sha256:base", "sha256:serving")
    assert key != image_store.store_key("sha256:base2", "sha256:serving")
    assert key != image_store.store_key("sha256:base", "sha256:serving2")


def test_a_missing_manifest_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setattr(image_store, "MANIFEST", tmp_path / "manifest.json")
    with pytest.raises(image_store.labctl.LabError, match=r"manifest.json is missing: run python3 lab/build_artifacts"):
        image_store.serving_entry()


def test_an_image_missing_from_the_manifest_says_what_to_run(tmp_path, monkeypatch):
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"images": {}, "base_image": {"id": "sha256:base"}}')
    monkeypatch.setattr(image_store, "MANIFEST", manifest)
    with pytest.raises(image_store.labctl.LabError, match=r"vllm/vllm-openai:v0.32.0 is not in .*build_artifacts"):
        image_store.serving_entry()


def seed_vllm_cache(share, host):
    script = image_store.vllm_cache_seed_script(str(share), str(host))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_a_new_host_gets_the_share_s_vllm_cache(tmp_path):
    share = tmp_path / "share" / "vllm-cache"
    (share / "modelinfos").mkdir(parents=True)
    (share / "modelinfos" / "qwen3.json").write_text('{"hash": "h"}')
    (share / "image-id").write_text("sha256:serving\n")
    host = tmp_path / "host" / "var" / "cache" / "onprem-vllm"
    assert seed_vllm_cache(share, host) == "seeded"
    assert (host / "modelinfos" / "qwen3.json").read_text() == '{"hash": "h"}'
    assert sorted(p.name for p in host.iterdir()) == ["modelinfos"]  # the stamp stays on the share
    assert oct(host.stat().st_mode & 0o777) == "0o755"  # what vllm_server's cache folder task sets: no change there


def test_a_host_s_own_vllm_cache_is_left_alone(tmp_path):
    share = tmp_path / "share"
    (share / "modelinfos").mkdir(parents=True)
    (share / "modelinfos" / "qwen3.json").write_text("share's")
    host = tmp_path / "host"
    (host / "modelinfos").mkdir(parents=True)
    (host / "modelinfos" / "qwen3.json").write_text("the host's own")
    assert seed_vllm_cache(share, host) == "in-use"
    assert (host / "modelinfos" / "qwen3.json").read_text() == "the host's own"


def test_the_vllm_cache_follows_the_serving_image(tmp_path):
    cache = tmp_path / "vllm-cache"
    assert not image_store.vllm_cache_is_current(cache, "sha256:serving")
    (cache / "modelinfos").mkdir(parents=True)
    (cache / "image-id").write_text("sha256:serving\n")
    assert not image_store.vllm_cache_is_current(cache, "sha256:serving")  # written by nothing yet
    (cache / "modelinfos" / "qwen3.json").write_text("{}")
    assert image_store.vllm_cache_is_current(cache, "sha256:serving")
    assert not image_store.vllm_cache_is_current(cache, "sha256:rebuilt")


def test_a_new_checkout_copies_the_machine_s_vllm_cache(tmp_path, monkeypatch):
    machine = tmp_path / "machine" / "vllm-cache"
    (machine / "modelinfos").mkdir(parents=True)
    (machine / "modelinfos" / "qwen3.json").write_text('{"hash": "h"}')
    (machine / "image-id").write_text("sha256:serving\n")
    monkeypatch.setattr(image_store, "MACHINE_VLLM_CACHE", machine)
    monkeypatch.setattr(image_store, "VLLM_CACHE", tmp_path / "share" / "vllm-cache")
    ran = []
    monkeypatch.setattr(image_store.labctl, "docker", lambda *args, **kw: ran.append(args))
    cache = image_store.warm_vllm_cache({"id": "sha256:serving", "tag": "vllm/vllm-openai:v0.32.0"})
    assert ran == []  # the serving image did not run
    assert (cache / "modelinfos" / "qwen3.json").read_text() == '{"hash": "h"}'
    assert image_store.vllm_cache_is_current(cache, "sha256:serving")
