# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the lab's fleet gateway image (HAProxy from Debian's packages) and put it on the lab's file share.

  python3 lab/build_gateway_image.py          build what changed (a second run is a no-op in about a second)
  python3 lab/build_gateway_image.py --force  rebuild

Makes onprem-vllm-lab/haproxy:<HAProxy's version>-trixie (HAProxy from Debian 13's package, running as user haproxy
uid/gid 99 as upstream's image does; labels onprem.vllm.lab=1 and onprem.vllm.lab.recipe=<hash>) FROM the lab's
Debian 13 root (labctl.build_trixie_root, mmdebstrap), and share/images/haproxy_<version>-trixie.tar (`docker save`),
which the gateway role loads on the gateway host like an air-gapped site would. The lab's inventories name this image
instead of the role's pinned official one (the lab has no registry). Cached by the hash of the Dockerfile, the root's
image ID and the pinned package version. Debian's mirror is plain HTTP: no CA bundle is needed for this build.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labctl  # noqa: E402

# Debian 13 ships the 3.0 LTS branch (trixie-security patches it); the role's default, the official image, runs 3.4.
# The configuration the role writes is valid for 3.0 and 3.4 alike (roles/gateway/README.md).
HAPROXY_DEB_VERSION = "3.0.11-1+deb13u5"
IMAGE_VERSION = HAPROXY_DEB_VERSION.split("-", 1)[0] + "-trixie"
IMAGE_TAG = f"onprem-vllm-lab/haproxy:{IMAGE_VERSION}"
CONTEXT = labctl.LAB_DIR / "gateway-image"
TAR = labctl.SHARE_DIR / "images" / f"haproxy_{IMAGE_VERSION}.tar"
RECIPE_VERSION = 3


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
    root = labctl.build_trixie_root()
    recipe = recipe_of(inspect(root)["Id"])
    info = inspect(IMAGE_TAG)
    if info is not None and labels(info).get(labctl.LAB_LABEL) != "1":
        raise labctl.LabError(f"{IMAGE_TAG} exists here and is not a lab image: the lab never re-tags a foreign image")
    if info is None or labels(info).get(f"{labctl.LAB_LABEL}.recipe") != recipe or force:
        started = time.monotonic()
        cmd = ["docker", "build", "--build-arg", f"BASE_IMAGE={root}",
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
