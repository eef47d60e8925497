# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab/labctl.py refuses bad input with one line and never touches what it did not create (real Docker engine)."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC = importlib.util.spec_from_file_location("labctl", os.path.join(ROOT, "lab", "labctl.py"))
labctl = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(labctl)


@pytest.mark.parametrize("count", ["0", "9", "-1"])
def test_unknown_lab_size_is_refused(count, capsys):
    assert labctl.main(["up", "--workstations", count]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"labctl: --workstations must be 1..8, got {count}"


def test_docker_not_running_says_what_to_do(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert labctl.main(["status"]) == 2
    assert "Docker is not running: start it" in capsys.readouterr().err


def test_missing_ca_bundle_is_refused(tmp_path, capsys):
    assert labctl.main(["image", "--ca-bundle", str(tmp_path / "none.crt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plan_addresses_and_names():
    plan = labctl.host_plan(3, True, "172.30.99.0/24")
    assert [(h["name"], h["ip"], h["role"]) for h in plan] == [
        ("onprem-lab-ws1", "172.30.99.11", "workstation"), ("onprem-lab-ws2", "172.30.99.12", "workstation"),
        ("onprem-lab-ws3", "172.30.99.13", "workstation"), ("onprem-lab-gw", "172.30.99.5", "gateway")]


def test_image_tag_follows_the_recipe():
    one = labctl.image_recipe("http://deb.debian.org/debian", None)
    other = labctl.image_recipe("http://mirror.example/debian", None)
    assert labctl.image_tag(one) == labctl.image_tag(dict(one))
    assert labctl.image_tag(one) != labctl.image_tag(other)
    # The Debian 13 workstation of `make test-driver` is another recipe; the bookworm one keeps its tag.
    trixie = labctl.image_recipe("http://deb.debian.org/debian", None, "trixie")
    assert trixie == dict(one, suite="trixie") and labctl.image_tag(trixie) != labctl.image_tag(one)


@pytest.mark.parametrize("rc", [0, 2])
def test_up_seed_hands_only_the_new_workstations_to_the_image_store_command(rc, monkeypatch, tmp_path, capsys):
    ran = []
    for name in ("require_docker", "ensure_network", "build_image", "run_host", "wait_for_systemd"):
        monkeypatch.setattr(labctl, name, lambda *args, **kw: None)
    monkeypatch.setattr(labctl, "SHARE_DIR", tmp_path / "share")
    # ws1 is a running lab host; ws2, ws3 and the gateway are created.
    monkeypatch.setattr(labctl, "lab_containers", lambda: {"onprem-lab-ws1": {"State": "running"}})
    monkeypatch.setattr(labctl, "docker", lambda *args, **kw: subprocess.CompletedProcess(args, int(
        args[-1] != "onprem-lab-ws1")))

    def run(argv, **kw):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, rc)
    monkeypatch.setattr(labctl.subprocess, "run", run)
    assert labctl.main(["up", "--workstations", "3", "--gateway", "--seed", "--no-ca-bundle"]) == (0 if rc == 0 else 2)
    assert ran == [[labctl.sys.executable, os.path.join(ROOT, "lab", "image_store.py"), "seed", "onprem-lab-ws2",
                    "onprem-lab-ws3"]]
    if rc:
        assert "labctl: seeding onprem-lab-ws2, onprem-lab-ws3 failed" in capsys.readouterr().err


@pytest.mark.needs_docker
def test_a_foreign_container_with_a_lab_name_is_refused_and_kept(capsys):
    image = f"onprem-test/empty:{uuid.uuid4().hex[:8]}"
    name = "onprem-lab-ws8"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    subprocess.run(f"tar -c --files-from /dev/null | docker import - {image}", shell=True, check=True,
                   capture_output=True)
    subprocess.run(["docker", "create", "--name", name, image, "/none"], check=True, capture_output=True)
    try:
        assert labctl.main(["up", "--workstations", "8"]) == 2
        assert "exists but is not a lab host" in capsys.readouterr().err
        assert subprocess.run(["docker", "inspect", name], capture_output=True, check=False).returncode == 0
        assert name not in labctl.lab_containers()  # so `down`, which removes only these, leaves it alone
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", image], capture_output=True, check=False)


@pytest.mark.needs_docker
def test_stale_tags_go_and_an_image_in_use_stays(capsys):
    repo = f"onprem-test/stale-{uuid.uuid4().hex[:8]}"
    current, stale, in_use = f"{repo}:current", f"{repo}:stale", f"{repo}:in-use"
    name = f"onprem-test-{uuid.uuid4().hex[:8]}"
    for tag in (current, stale, in_use):  # three distinct images (each import has its own ID)
        subprocess.run(f"tar -c --files-from /dev/null | docker import --change 'LABEL t={tag}' - {tag}", shell=True,
                       check=True, capture_output=True)
    subprocess.run(["docker", "create", "--name", name, in_use, "/none"], check=True, capture_output=True)
    try:
        labctl.remove_stale_tags(repo, {current})
        left = subprocess.run(["docker", "image", "ls", repo, "--format", "{{.Repository}}:{{.Tag}}"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert sorted(left) == sorted([current, in_use])
        assert capsys.readouterr().out.strip() == f"removed stale image {stale}"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", current, stale, in_use], capture_output=True, check=False)


class FakeSave:
    """Stands in for `docker save -o FILE TAG`: writes the tag's current content, counts the saves."""

    def __init__(self):
        self.saves = []
        self.content = {}

    def __call__(self, *args, **_):
        assert args[:2] == ("save", "-o"), args
        Path(args[2]).write_text(self.content[args[3]])
        Path(args[2]).chmod(0o600)  # as docker save writes it
        self.saves.append(args[3])


@pytest.fixture
def fake_save(monkeypatch, tmp_path):
    fake = FakeSave()
    monkeypatch.setattr(labctl, "docker", fake)
    monkeypatch.setattr(labctl, "ARCHIVE_CACHE", tmp_path / "cache")
    return fake


def test_a_second_checkout_links_the_archive_instead_of_saving_it(fake_save, tmp_path):
    fake_save.content["vllm/vllm-openai:v0.32.0"] = "image one"
    first = tmp_path / "checkout1" / "images" / "vllm-openai_v0.32.0.tar"
    second = tmp_path / "checkout2" / "images" / "vllm-openai_v0.32.0.tar"
    assert labctl.save_image_archive("vllm/vllm-openai:v0.32.0", "sha256:" + "a" * 64, first) == "saved"
    assert labctl.save_image_archive("vllm/vllm-openai:v0.32.0", "sha256:" + "a" * 64, second) == "linked"
    assert fake_save.saves == ["vllm/vllm-openai:v0.32.0"]
    assert second.read_text() == "image one" and os.path.samefile(first, second)
    assert (first.stat().st_mode & 0o777) == 0o644  # every lab host reads the share
    assert not list(first.parent.glob("*.partial")) and not list(second.parent.glob("*.partial"))


def test_a_rebuilt_image_is_saved_again_and_replaces_only_its_own_tag_in_the_cache(fake_save, tmp_path):
    dest = tmp_path / "share" / "vllm-openai_v0.32.0.tar"
    other = tmp_path / "share" / "vllm-openai_v0.32.0-lab2.tar"
    fake_save.content = {"vllm/vllm-openai:v0.32.0": "old", "vllm/vllm-openai:v0.32.0-lab2": "lab2"}
    labctl.save_image_archive("vllm/vllm-openai:v0.32.0", "sha256:" + "1" * 64, dest)
    labctl.save_image_archive("vllm/vllm-openai:v0.32.0-lab2", "sha256:" + "2" * 64, other)
    fake_save.content["vllm/vllm-openai:v0.32.0"] = "new"
    assert labctl.save_image_archive("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, dest) == "saved"
    assert dest.read_text() == "new"
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert cached == ["vllm-openai_v0.32.0-lab2." + "2" * 16 + ".tar", "vllm-openai_v0.32.0." + "3" * 16 + ".tar"]


def test_a_cache_on_another_filesystem_falls_back_to_saving(fake_save, tmp_path, monkeypatch):
    tag = "onprem-vllm-lab/haproxy:3.0.11-trixie"
    fake_save.content[tag] = "gateway"
    dest = tmp_path / "share" / "haproxy_3.0.11-trixie.tar"
    kept = tmp_path / "cache" / ("haproxy_3.0.11-trixie." + "c" * 16 + ".tar")  # another checkout's, on its filesystem
    kept.parent.mkdir()
    kept.write_text("older gateway")

    def cross_device(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(labctl.os, "link", cross_device)
    for attempt in ("first", "second"):
        assert labctl.save_image_archive(tag, "sha256:" + "b" * 64, dest) == "saved", attempt
    assert dest.read_text() == "gateway" and fake_save.saves == [tag] * 2
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # the cache is left as it was


def _inspect_image(ref: str) -> dict:
    return json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True,
                                     check=True).stdout)[0]


def _write_saved_image(path: Path, diff_ids: list[str], layers: dict[str, bytes]) -> None:
    """A `docker save` archive as Docker 20.10 writes it: a folder per layer, the config, manifest.json."""

    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    files = {"manifest.json": json.dumps([{"Config": "cfg.json", "RepoTags": ["t:1"],
                                           "Layers": [f"{name}/layer.tar" for name in layers]}]).encode(),
             "cfg.json": config}
    for name, data in layers.items():
        files[f"{name}/VERSION"] = b"1.0"
        files[f"{name}/layer.tar"] = data
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_an_upgrade_archive_leaves_out_only_the_layers_hosts_have(tmp_path):
    full = tmp_path / "full.tar"
    _write_saved_image(full, ["sha256:a", "sha256:b", "sha256:c"], {"l1": b"A" * 10, "l2": b"B" * 10, "l3": b"C"})
    thin = tmp_path / "thin.tar"
    # The chain must match from the bottom: b under a different a is another layer.
    assert labctl.omit_host_layers(full, thin, ["sha256:a", "sha256:b", "sha256:x"]) == 2
    names = tarfile.open(thin).getnames()
    assert "l1/layer.tar" not in names and "l2/layer.tar" not in names
    assert {"l3/layer.tar", "manifest.json", "cfg.json", "l1/VERSION"} <= set(names)
    assert labctl.omit_host_layers(full, tmp_path / "t2.tar", ["sha256:x", "sha256:b"]) == 0
    assert "l2/layer.tar" in tarfile.open(tmp_path / "t2.tar").getnames()


@pytest.mark.needs_docker
def test_an_upgrade_archive_loads_the_same_image_where_its_base_is_and_fails_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(labctl, "ARCHIVE_CACHE", tmp_path / "cache")
    repo = f"onprem-test/delta-{uuid.uuid4().hex[:8]}"
    base, child = f"{repo}:base", f"{repo}:child"
    (tmp_path / "f").write_bytes(os.urandom(256 * 1024))
    subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(tmp_path / "rootfs.tar"), "f"], check=True)
    subprocess.run(["docker", "import", str(tmp_path / "rootfs.tar"), base], check=True, capture_output=True)
    subprocess.run(["docker", "build", "-t", child, "-"], input=f"FROM {base}\nLABEL variant=child\n", text=True,
                   check=True, capture_output=True)
    try:
        child_id, base_layers = _inspect_image(child)["Id"], _inspect_image(base)["RootFS"]["Layers"]
        dest = tmp_path / "share" / "delta_child.tar"
        assert labctl.save_image_archive(child, child_id, dest, base_layers) == "saved"
        assert dest.stat().st_size < 64 * 1024  # the 256 KiB layer is not in it
        subprocess.run(["docker", "rmi", child], check=True, capture_output=True)
        subprocess.run(["docker", "load", "-i", str(dest)], check=True, capture_output=True)
        assert _inspect_image(child)["Id"] == child_id
        subprocess.run(["docker", "rmi", child, base], check=True, capture_output=True)
        failed = subprocess.run(["docker", "load", "-i", str(dest)], capture_output=True, text=True, check=False)
        assert failed.returncode != 0 and "layer.tar" in failed.stderr
    finally:
        subprocess.run(["docker", "rmi", child, base], capture_output=True, check=False)
