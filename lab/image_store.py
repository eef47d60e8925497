# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One image store for every lab host: the serving image is loaded once, not once per host.

Every lab host runs its own Docker engine on its own /var/lib/docker volume, and `docker load` of the serving archive
took 55-80 s per host when it was 4.15 GB (it unpacks the whole archive, then applies each layer). Instead:

  store   a "store builder" host (the lab base image, Debian's docker.io) loads the archive once into a Docker volume,
          the template, cached by the IDs of the base image and of the serving image;
  seed    before a new host's engine first starts, its /var/lib/docker gets the template's layer folders as hard links
          (seconds, no extra disk) and its own copy of the image metadata.

Why hard links are safe: Docker's overlay2 driver never writes into an image layer's folder once the layer exists
(containers write to their own upper folder; overlayfs copies a file up before changing it), and a host that deletes
the image only unlinks its own names. Only `image/` and `overlay2/` are taken: engine-id, networks, containers and
Docker's bolt databases are per engine and the host's engine creates its own. A host whose data root is already in
use is never seeded. A host that is not seeded loads the archive itself, as a real air-gapped host does (vllm_server's
image.yml), so seeding changes how fast a lab host gets the image, not whether the role can load one. The
upgrade tag's archive (v0.32.0-lab2) holds only what it adds to the serving image: it loads on a host that has
the serving image, seeded or loaded (build_artifacts.py, labctl.omit_host_layers).

vLLM's own cache goes with the image: before its first start, vLLM inspects the model's class in a subprocess that
imports torch and vLLM once more (15-30 s on the lab's cores) and keeps the answer under VLLM_CACHE_ROOT/modelinfos,
keyed by the hash of the model's source file. vllm_server mounts the host's /var/cache/onprem-vllm there, so a host
that has served pays this once. `store` has the serving image write that cache once into the share (vllm-cache/,
remade when the image changes) and `seed` copies it into each new host, as on a host that served this image before.

  python3 lab/image_store.py store                 build (or reuse) the template and vLLM's cache for the serving image
  python3 lab/image_store.py seed HOST [HOST ...]  seed running lab hosts (containers) that have no engine data yet
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labctl  # noqa: E402  (the lab's docker() wrapper, base image, host options and share folder)

STORE_LABEL = "onprem.vllm.lab.store"
STORE_PREFIX = "onprem-lab-store-"
BUILDER = "onprem-lab-store-builder"
RECIPE_VERSION = 1
MANIFEST = labctl.SHARE_DIR / "manifest.json"
SERVING_TAG = "vllm/vllm-openai:v0.32.0"
DATA_ROOT = "/var/lib/docker"
VLLM_CACHE = labctl.SHARE_DIR / "vllm-cache"
MACHINE_VLLM_CACHE = labctl.ARCHIVE_CACHE.parent / "vllm-cache"  # beside the archives kept once per machine
# vllm_server_cache_path's default: the host folder the role mounts at the server's VLLM_CACHE_ROOT.
HOST_VLLM_CACHE = "/var/cache/onprem-vllm"
# Run in the serving image: the model-class inspection vLLM runs before a first start, which writes the cache.
INSPECT_SNIPPET = (
    "import sys\n"
    "from vllm.model_executor.models.registry import ModelRegistry\n"
    "for arch in sys.argv[1:]:\n"
    "    ModelRegistry.models[arch].inspect_model_cls()\n"
)


def store_key(base_id: str, image_id: str) -> str:
    recipe = {"base": base_id, "image": image_id, "version": RECIPE_VERSION}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def serving_entry(tag: str = SERVING_TAG) -> dict:
    if not MANIFEST.exists():
        raise labctl.LabError(f"{MANIFEST} is missing: run python3 lab/build_artifacts.py first")
    manifest = json.loads(MANIFEST.read_text())
    entry = manifest.get("images", {}).get(tag)
    if not entry:
        raise labctl.LabError(f"{tag} is not in {MANIFEST}: run python3 lab/build_artifacts.py first")
    return {"tag": tag, "id": entry["id"], "tar": entry["tar"], "base_id": manifest["base_image"]["id"]}


def store_volumes() -> dict[str, str]:
    """Template volumes by name -> key."""
    proc = labctl.docker("volume", "ls", "--filter", f"label={STORE_LABEL}", "--format",
                         f'{{{{.Name}}}} {{{{.Label "{STORE_LABEL}"}}}}')
    return dict(line.split() for line in proc.stdout.splitlines() if line.strip())


def build_store(entry: dict) -> str:
    """Load the serving archive once into a template volume; reuse it while the base and serving images are the same."""
    key = store_key(entry["base_id"], entry["id"])
    volume = f"{STORE_PREFIX}{key}"
    existing = store_volumes()
    if volume in existing:
        print(f"image store {volume} is up to date")
        return volume
    started = time.monotonic()
    labctl.docker("rm", "-f", BUILDER, check=False)
    labctl.docker("volume", "create", "--label", f"{STORE_LABEL}={key}", volume)
    try:
        labctl.docker("run", "-d", *labctl.systemd_host_args(BUILDER, volume), entry["base_id"])
        labctl.wait_for_systemd(BUILDER)
        # The same engine package the docker_engine role installs from the distribution (Debian's docker.io).
        steps = [
            ["sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null"],
            ["docker", "load", "-q", "-i", f"/srv/lab-share/images/{Path(entry['tar']).name}"],
            ["systemctl", "stop", "docker.service", "docker.socket", "containerd.service"],
        ]
        for argv in steps:
            proc = labctl.docker("exec", BUILDER, *argv, check=False)
            if proc.returncode != 0:
                raise labctl.LabError(f"image store: `{' '.join(argv[:3])}` failed in {BUILDER}: "
                                      f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        found = labctl.docker("exec", BUILDER, "test", "-d", f"{DATA_ROOT}/overlay2", check=False)
        if found.returncode != 0:
            raise labctl.LabError(f"image store: {BUILDER}'s engine did not use {DATA_ROOT}/overlay2")
    except BaseException:
        labctl.docker("rm", "-f", BUILDER, check=False)
        labctl.docker("volume", "rm", volume, check=False)
        raise
    labctl.docker("rm", "-f", BUILDER)
    for stale in set(existing) - {volume}:
        if labctl.docker("volume", "rm", stale, check=False).returncode == 0:
            print(f"removed stale image store {stale}")
    print(f"built image store {volume} ({entry['tag']}) in {time.monotonic() - started:.0f} s")
    return volume


def model_architectures() -> list[str]:
    """The architectures in the lab checkpoint's config.json (what vLLM inspects before serving it)."""
    manifest = json.loads(MANIFEST.read_text())
    for model in manifest.get("models", {}).values():
        snapshot = labctl.SHARE_DIR / model["hf_seed"] / "snapshots" / model["revision"]
        return json.loads((snapshot / "config.json").read_text())["architectures"]
    raise labctl.LabError(f"no model in {MANIFEST}: run python3 lab/build_artifacts.py first")


def vllm_cache_is_current(cache: Path, image_id: str) -> bool:
    stamp = cache / "image-id"
    return stamp.is_file() and stamp.read_text().strip() == image_id and any((cache / "modelinfos").glob("*.json"))


def warm_vllm_cache(entry: dict) -> Path:
    """vLLM's model-class cache, written by the serving image itself; remade only when the image changes. Like the
    image archives, it is kept once per machine (a new checkout copies it instead of running the image again)."""
    if vllm_cache_is_current(VLLM_CACHE, entry["id"]):
        print(f"vLLM cache {VLLM_CACHE.name} is up to date")
        return VLLM_CACHE
    started = time.monotonic()
    fresh = VLLM_CACHE.with_name(VLLM_CACHE.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    if vllm_cache_is_current(MACHINE_VLLM_CACHE, entry["id"]):
        shutil.copytree(MACHINE_VLLM_CACHE, fresh)
        how = f"copied from {MACHINE_VLLM_CACHE}"
    else:
        fresh.mkdir(parents=True)
        proc = labctl.docker("run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}",
                             "-e", "HOME=/tmp", "-e", "VLLM_CACHE_ROOT=/cache", "-v", f"{fresh}:/cache",
                             "--entrypoint", "/opt/vllm/bin/python", entry["tag"], "-c", INSPECT_SNIPPET,
                             *model_architectures(), check=False)
        if proc.returncode != 0 or not any((fresh / "modelinfos").glob("*.json")):
            shutil.rmtree(fresh, ignore_errors=True)
            raise labctl.LabError(f"vLLM cache: the model-class inspection in {entry['tag']} wrote nothing: "
                                  f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        (fresh / "image-id").write_text(entry["id"] + "\n")
        shutil.rmtree(MACHINE_VLLM_CACHE, ignore_errors=True)
        shutil.copytree(fresh, MACHINE_VLLM_CACHE)
        how = "written by the image"
    shutil.rmtree(VLLM_CACHE, ignore_errors=True)
    fresh.rename(VLLM_CACHE)
    print(f"vLLM's model-class cache for {entry['tag']}: {how} in {time.monotonic() - started:.0f} s")
    return VLLM_CACHE


def vllm_cache_seed_script(share_cache: str, host_cache: str) -> str:
    """Shell run in a new host: copies the share's model-class cache unless the host already has one of its own."""
    return (f"set -e; if [ -d {host_cache}/modelinfos ]; then echo in-use; exit 0; fi; "
            f"mkdir -p {host_cache}; chmod 0755 {host_cache}; cp -R {share_cache}/modelinfos {host_cache}/; echo seeded")


def data_root_volume(host: str) -> str:
    proc = labctl.docker("container", "inspect", host, check=False)
    if proc.returncode != 0:
        raise labctl.LabError(f"{host}: no such container")
    mounts = json.loads(proc.stdout)[0].get("Mounts", [])
    for mount in mounts:
        if mount.get("Destination") == DATA_ROOT and mount.get("Type") == "volume":
            return mount["Name"]
    raise labctl.LabError(f"{host}: {DATA_ROOT} is not a Docker volume, so it cannot be seeded")


def seed_script(volumes: str, template: str, target: str) -> str:
    """Shell run in a helper container that sees the engine's whole volumes folder at `volumes`: hard links cannot
    cross mounts, so the template and the target must be reached through one."""
    src, dst = f"{volumes}/{template}/_data", f"{volumes}/{target}/_data"
    return (f"set -e; if [ -e {dst}/image ] || [ -e {dst}/overlay2 ]; then echo in-use; exit 0; fi; "
            f"cp -a {src}/image {dst}/image; cp -al {src}/overlay2 {dst}/overlay2; echo seeded")


def seed(hosts: list[str], entry: dict) -> None:
    info = labctl.require_docker()
    template = build_store(entry)
    warm_vllm_cache(entry)
    volumes_dir = f"{info.get('DockerRootDir', '/var/lib/docker')}/volumes"
    for host in hosts:
        target = data_root_volume(host)
        # A host whose engine already runs (or ran) keeps its data root: seeding is only for new hosts.
        running = labctl.docker("exec", host, "test", "-S", "/run/docker.sock", check=False).returncode == 0
        if running:
            print(f"{host}: its engine is running; not seeded")
            continue
        started = time.monotonic()
        proc = labctl.docker("run", "--rm", "--network", "none", "-v", f"{volumes_dir}:/volumes",
                             "--entrypoint", "sh", entry["base_id"], "-c", seed_script("/volumes", template, target))
        verdict = proc.stdout.strip().splitlines()[-1:] or ["?"]
        if verdict[0] == "in-use":
            print(f"{host}: its data root already holds images; not seeded")
            continue
        share_cache = f"/srv/lab-share/{VLLM_CACHE.relative_to(labctl.SHARE_DIR)}"
        labctl.docker("exec", host, "sh", "-c", vllm_cache_seed_script(share_cache, HOST_VLLM_CACHE))
        print(f"{host}: seeded with {entry['tag']} from {template} and vLLM's cache in "
              f"{time.monotonic() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("store", help="build or reuse the template volume")
    p_seed = sub.add_parser("seed", help="seed new lab hosts' data roots from the template")
    p_seed.add_argument("hosts", nargs="+")
    args = parser.parse_args(argv)
    try:
        labctl.require_docker()
        entry = serving_entry()
        if args.command == "store":
            # The template's load (Docker's disk) and the cache's model inspection (one core) at once: on a fresh
            # machine 79 s for both (2026-12-03), 66 s and 22 s one after the other the run before.
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                cache_written = pool.submit(warm_vllm_cache, entry)
                build_store(entry)
                cache_written.result()
        else:
            seed(args.hosts, entry)
    except labctl.LabError as exc:
        print(f"image_store: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
