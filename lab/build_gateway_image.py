# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the fleet gateway image (HAProxy from Debian's packages) and put it on the lab's file share.

  python3 lab/build_gateway_image.py          build what changed (a second run is a no-op in about a second)
  python3 lab/build_gateway_image.py --force  rebuild

Makes haproxy:<the gateway role's gateway_image_tag> (a look-alike of the pinned official image: HAProxy from Debian
12's package, the newest Debian offers that base, running as user haproxy uid/gid 99 as upstream's image does; labels
onprem.vllm.lab=1 and onprem.vllm.lab.recipe=<hash>) FROM the lab base image, and share/images/haproxy_<version>.tar (`docker save`), which
the gateway role loads on the gateway host like an air-gapped site would. Cached by the hash of the Dockerfile, the
base image ID and the pinned package version. Debian's mirror is plain HTTP: no CA bundle is needed for this build.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labctl  # noqa: E402

# Debian 12 ships the 2.6 LTS line (bookworm-security patches it; no backport of a newer branch, and trixie's 3.0
# needs a newer libc): the lab runs it under the role's pinned tag, so the role's files, user and config are what
# the lab tests. The configuration the role writes is valid for 2.6 and 3.4 alike.
HAPROXY_DEB_VERSION = "2.6.12-1+deb12u4"
ROLE_DEFAULTS = labctl.LAB_DIR.parent / "roles" / "gateway" / "defaults" / "main.yml"


def role_image_tag() -> str:
    match = re.search(r'^gateway_image_tag:\s*"?([^"\s]+)"?\s*$', ROLE_DEFAULTS.read_text(), re.MULTILINE)
    if not match:
        raise SystemExit(f"build_gateway_image: no gateway_image_tag in {ROLE_DEFAULTS}")
    return match.group(1)


IMAGE_VERSION = role_image_tag()
IMAGE_TAG = f"haproxy:{IMAGE_VERSION}"
CONTEXT = labctl.LAB_DIR / "gateway-image"
TAR = labctl.SHARE_DIR / "images" / f"haproxy_{IMAGE_VERSION}.tar"
RECIPE_VERSION = 2


def inspect(ref: str) -> dict | None:
    proc = labctl.docker("image", "inspect", ref, check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def labels(info: dict | None) -> dict:
    return ((info or {}).get("Config") or {}).get("Labels") or {}


def recipe_of(base_id: str) -> str:
    data = {"dockerfile": hashlib.sha256((CONTEXT / "Dockerfile").read_bytes()).hexdigest(), "base": base_id,
            "deb": HAPROXY_DEB_VERSION, "tag": IMAGE_TAG, "recipe_version": RECIPE_VERSION}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def build(force: bool) -> str:
    labctl.require_docker()
    base = inspect(f"{labctl.IMAGE_REPO}:latest")
    if base is None:
        labctl.build_image(labctl.DEFAULT_CA_BUNDLE if labctl.DEFAULT_CA_BUNDLE.is_file() else None)
        base = inspect(f"{labctl.IMAGE_REPO}:latest")
    recipe = recipe_of(base["Id"])
    info = inspect(IMAGE_TAG)
    if info is not None and labels(info).get(labctl.LAB_LABEL) != "1":
        raise labctl.LabError(f"{IMAGE_TAG} exists here and is not a lab image: the lab never re-tags a foreign image")
    if info is None or labels(info).get(f"{labctl.LAB_LABEL}.recipe") != recipe or force:
        started = time.monotonic()
        cmd = ["docker", "build", "--build-arg", f"BASE_IMAGE={labctl.IMAGE_REPO}:latest",
               "--build-arg", f"HAPROXY_DEB_VERSION={HAPROXY_DEB_VERSION}", "--build-arg", f"RECIPE={recipe}",
               "-t", IMAGE_TAG, str(CONTEXT)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise labctl.LabError(f"docker build of {IMAGE_TAG} failed: {proc.stdout.strip().splitlines()[-5:]}")
        print(f"built {IMAGE_TAG} (recipe {recipe}) in {time.monotonic() - started:.0f} s")
        info = inspect(IMAGE_TAG)
    else:
        print(f"{IMAGE_TAG} is up to date (recipe {recipe})")
    stamp = TAR.with_suffix(".id")
    if force or not TAR.exists() or not stamp.exists() or stamp.read_text().strip() != info["Id"]:
        how = labctl.save_image_archive(IMAGE_TAG, info["Id"], TAR)
        stamp.write_text(info["Id"] + "\n")
        print(f"{how} {TAR} ({TAR.stat().st_size / 1e6:.0f} MB)")
    else:
        print(f"{TAR} is up to date")
    return info["Id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild the image and the tarball")
    args = parser.parse_args(argv)
    try:
        build(args.force)
    except labctl.LabError as exc:
        print(f"build_gateway_image: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
