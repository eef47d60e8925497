# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST DOUBLE of NVIDIA's apt repositories, built inside a lab workstation by molecule/gpu_stack/prepare.yml.

The lab has no GPU and cannot reach NVIDIA's servers, so this script makes, under ROOT:
  cuda/debian12/x86_64/                 flat repository like NVIDIA's CUDA repository for Debian 12, with a
                                        cuda-keyring_1.1-1_all.deb that installs the (test) archive key and a list
  libnvidia-container/stable/deb/amd64/ flat repository like NVIDIA's libnvidia-container repository
  libnvidia-container/gpgkey            its (test) signing key, ASCII-armoured like NVIDIA's
Every package is an EMPTY dummy named like NVIDIA's (no driver, no kernel module); versions are chosen so the
roles' choices show: a newer branch (590) the pin must refuse, a newer Fabric Manager than the driver (version
drift), a newer toolkit than the pinned one. nvidia-persistenced and nvidia-fabricmanager carry a systemd unit that
only sleeps; nvidia-container-toolkit-base carries an `nvidia-ctk` script that writes a labelled CDI spec.
The repositories are signed with a throw-away GPG key made here (Release, Release.gpg, InRelease).

With a third argument, CAPTURE (a folder holding fake_nvidia_smi.py and a recorded case from tests/unit/fixtures/gpu,
copied onto the host by the scenario), the packages also carry what the real GPU code path needs
(molecule/gpu_workstation):
  nvidia-driver            /usr/bin/nvidia-smi replaying the recorded case (the XML, topo -m, topo -p2p r) and
                           nvidia-smi -L listing its GPUs
  nvidia-container-toolkit /usr/bin/nvidia-container-runtime-hook, so the Docker daemon registers its "nvidia"
                           device driver and accepts --gpus / device_requests (the hook's prestart does nothing), and
                           /usr/bin/nvidia-container-runtime (runc under another name)
Each says TEST DOUBLE where it prints (stderr: stdout is what the roles parse).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile

ROOT = sys.argv[1] if len(sys.argv) > 1 else "/srv/test-double-repos"
BASE_URL = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:8080"
CAPTURE = sys.argv[3] if len(sys.argv) > 3 else ""
REPLAY_DIR = "/usr/lib/test-double-nvidia"

NVIDIA_SMI = """#!/bin/sh
# TEST DOUBLE of nvidia-smi (onprem.vllm molecule gpu_workstation): replays a recorded capture, drives no GPU.
echo "nvidia-smi: TEST DOUBLE replaying the recorded capture {case}" >&2
if [ "$1" = -L ]; then
  python3 - <<'PY'
import re
xml = open("{replay}/capture/nvidia-smi-q.xml").read()
for n, (name, uuid) in enumerate(zip(re.findall("<product_name>([^<]*)", xml), re.findall("<uuid>([^<]*)", xml))):
    print("GPU %d: %s (UUID: %s)" % (n, name, uuid))
PY
  exit 0
fi
FAKE_NVIDIA_SMI_CASE={replay}/capture exec python3 {replay}/fake_nvidia_smi.py "$@"
"""

RUNTIME_HOOK = """#!/bin/sh
# TEST DOUBLE of nvidia-container-runtime-hook (onprem.vllm molecule gpu_workstation). The Docker daemon registers
# its "nvidia" device driver (--gpus, device_requests) when this binary is on its PATH and runs it as an OCI prestart
# hook; this one reads the container state and exposes nothing: the lab's vLLM is the CPU build.
cat >/dev/null
echo "$(date +%s) TEST DOUBLE nvidia-container-runtime-hook $*" >> /var/log/test-double-nvidia-hook.log
exit 0
"""

RUNTIME = """#!/bin/sh
# TEST DOUBLE of nvidia-container-runtime (onprem.vllm molecule gpu_workstation): runc under NVIDIA's name. Its stdout
# belongs to the runtime protocol: it says what it is in a log, as the hook does.
echo "$(date +%s) TEST DOUBLE nvidia-container-runtime $*" >> /var/log/test-double-nvidia-runtime.log
exec runc "$@"
"""

SLEEP_UNIT = """[Unit]
Description=TEST DOUBLE of {name} (onprem.vllm molecule gpu_stack; sleeps, drives nothing)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
"""

NVIDIA_CTK = """#!/bin/sh
# TEST DOUBLE of nvidia-ctk (onprem.vllm molecule gpu_stack): writes a labelled CDI spec, touches no GPU.
set -e
out=/etc/cdi/nvidia.yaml
for a in "$@"; do
  case "$a" in
    --output=*) out="${a#--output=}";;
    --version) echo "NVIDIA Container Toolkit CLI version {version} (test double)"; exit 0;;
  esac
done
if [ "$1" = cdi ] && [ "$2" = generate ]; then
  mkdir -p "$(dirname "$out")"
  printf '%s\\n' '# TEST DOUBLE CDI spec written by the lab nvidia-ctk stand-in' 'cdiVersion: 0.5.0' 'kind: nvidia.com/gpu' 'devices: []' > "$out"
  date +%s.%N >> /var/log/test-double-nvidia-ctk.log
  exit 0
fi
echo "test-double nvidia-ctk: unsupported arguments: $*" >&2
exit 2
"""


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def build_deb(outdir, name, version, files=None, arch="amd64", depends=""):
    files = files or {}
    with tempfile.TemporaryDirectory() as tree:
        os.makedirs(os.path.join(tree, "DEBIAN"))
        control = ("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: onprem.vllm lab <lab@invalid>\n"
                   "Section: non-free/misc\nPriority: optional\n%sDescription: TEST DOUBLE of NVIDIA's %s\n"
                   " Empty package for the onprem.vllm molecule tests; drives no GPU.\n"
                   % (name, version, arch, ("Depends: %s\n" % depends) if depends else "", name))
        with open(os.path.join(tree, "DEBIAN", "control"), "w") as handle:
            handle.write(control)
        for path, (content, mode) in files.items():
            full = os.path.join(tree, path.lstrip("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb" if isinstance(content, bytes) else "w") as handle:
                handle.write(content)
            os.chmod(full, mode)
        deb = os.path.join(outdir, "%s_%s_%s.deb" % (name, version, arch))
        run("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", tree, deb)
    return deb


def write_index(repo_dir, label, gnupghome):
    """Packages, Release, Release.gpg and InRelease of a flat repository ("deb URL /")."""
    stanzas = []
    for deb in sorted(f for f in os.listdir(repo_dir) if f.endswith(".deb")):
        path = os.path.join(repo_dir, deb)
        data = open(path, "rb").read()
        fields = run("dpkg-deb", "-f", path).rstrip("\n")
        stanzas.append("%s\nFilename: ./%s\nSize: %d\nMD5sum: %s\nSHA256: %s\n" % (
            fields, deb, len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()))
    packages = "\n".join(stanzas)
    with open(os.path.join(repo_dir, "Packages"), "w") as handle:
        handle.write(packages)
    body = packages.encode()
    release = ("Origin: onprem.vllm test double\nLabel: %s (TEST DOUBLE)\nArchitectures: amd64 all\n"
               "Date: Sun, 29 Nov 2026 00:00:00 UTC\nMD5Sum:\n %s %d Packages\nSHA256:\n %s %d Packages\n"
               % (label, hashlib.md5(body).hexdigest(), len(body), hashlib.sha256(body).hexdigest(), len(body)))
    with open(os.path.join(repo_dir, "Release"), "w") as handle:
        handle.write(release)
    env = dict(os.environ, GNUPGHOME=gnupghome)
    for out, flag in (("Release.gpg", "--detach-sign"), ("InRelease", "--clearsign")):
        target = os.path.join(repo_dir, out)
        if os.path.exists(target):
            os.remove(target)
        run("gpg", "--batch", "--yes", "--armor", flag, "-o", target, os.path.join(repo_dir, "Release"), env=env)


def main():
    gnupghome = tempfile.mkdtemp(prefix="test-double-gpg-")
    os.chmod(gnupghome, 0o700)
    env = dict(os.environ, GNUPGHOME=gnupghome)
    run("gpg", "--batch", "--passphrase", "", "--quick-gen-key", "onprem.vllm TEST DOUBLE repository key",
        "rsa2048", "sign", "never", env=env)
    armored = run("gpg", "--armor", "--export", env=env)
    binary = subprocess.run(["gpg", "--export"], check=True, capture_output=True, env=env).stdout

    cuda = os.path.join(ROOT, "cuda", "debian12", "x86_64")
    ctk = os.path.join(ROOT, "libnvidia-container", "stable", "deb", "amd64")
    os.makedirs(cuda, exist_ok=True)
    os.makedirs(ctk, exist_ok=True)

    # cuda-keyring installs the archive key and a list for the repository, as NVIDIA's does.
    build_deb(cuda, "cuda-keyring", "1.1-1", arch="all", files={
        "/usr/share/keyrings/cuda-archive-keyring.gpg": (binary, 0o644),
        "/etc/apt/sources.list.d/cuda-debian12-x86_64.list": (
            "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] %s/cuda/debian12/x86_64/ /\n" % BASE_URL,
            0o644),
    })
    replay = {}
    if CAPTURE:
        replay["%s/fake_nvidia_smi.py" % REPLAY_DIR] = (open(os.path.join(CAPTURE, "fake_nvidia_smi.py")).read(), 0o644)
        case = os.path.join(CAPTURE, "case")
        for name in sorted(os.listdir(case)):
            replay["%s/capture/%s" % (REPLAY_DIR, name)] = (open(os.path.join(case, name)).read(), 0o644)
        case_name = open(os.path.join(CAPTURE, "case-name")).read().strip() if os.path.exists(
            os.path.join(CAPTURE, "case-name")) else "case"
        replay["/usr/bin/nvidia-smi"] = (NVIDIA_SMI.replace("{case}", case_name).replace("{replay}", REPLAY_DIR), 0o755)
    for version in ("580.95.05-1", "580.105.08-1", "590.44.01-1"):
        for name in ("nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-kernel-support"):
            build_deb(cuda, name, version, files=replay if name == "nvidia-driver" else None)
        build_deb(cuda, "nvidia-persistenced", version, files={
            "/lib/systemd/system/nvidia-persistenced.service": (SLEEP_UNIT.format(name="nvidia-persistenced"), 0o644)})
    # Fabric Manager exists in a NEWER build than the newest 580 driver: installing "the newest" would drift.
    for version in ("580.105.08-1", "580.126.09-1", "590.44.01-1"):
        build_deb(cuda, "nvidia-fabricmanager", version, files={
            "/lib/systemd/system/nvidia-fabricmanager.service": (SLEEP_UNIT.format(name="nvidia-fabricmanager"), 0o644)})
    write_index(cuda, "NVIDIA CUDA debian12", gnupghome)

    for version in ("1.17.8-1", "1.18.0-1", "1.18.1-1"):
        build_deb(ctk, "libnvidia-container1", version)
        build_deb(ctk, "libnvidia-container-tools", version)
        build_deb(ctk, "nvidia-container-toolkit-base", version, files={
            "/usr/bin/nvidia-ctk": (NVIDIA_CTK.replace("{version}", version.split("-", maxsplit=1)[0]), 0o755)})
        build_deb(ctk, "nvidia-container-toolkit", version, files={
            "/usr/bin/nvidia-container-runtime-hook": (RUNTIME_HOOK, 0o755),
            "/usr/bin/nvidia-container-runtime": (RUNTIME, 0o755),
        } if CAPTURE else None)
    write_index(ctk, "libnvidia-container", gnupghome)
    with open(os.path.join(ROOT, "libnvidia-container", "gpgkey"), "w") as handle:
        handle.write(armored)
    print("test double repositories ready under %s" % ROOT)


if __name__ == "__main__":
    main()
