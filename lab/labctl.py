# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The embedded lab: real Debian 12 "workstations" (systemd + their own Docker engine) as containers on this machine.

Built without any registry: the base image comes from Debian's packages (mmdebstrap + docker import) and is cached by
the hash of its recipe. Every object the lab creates carries the label onprem.vllm.lab, and `down` removes only those.

  labctl.py image                       build (or reuse) the workstation base image
  labctl.py up [--workstations N] [--gateway] [--seed]
  labctl.py down
  labctl.py status
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LAB_LABEL = "onprem.vllm.lab"
ROLE_LABEL = "onprem.vllm.lab.role"
IMAGE_REPO = "onprem-vllm-lab/workstation"
NETWORK = "onprem-lab"
DEFAULT_SUBNET = "172.30.99.0/24"
HOST_PREFIX = "onprem-lab-"
MAX_WORKSTATIONS = 8
# The base image is ~250 MB, each workstation's nested engine later holds the serving image (~4.5 GB).
MIN_FREE_BYTES_IMAGE = 2 * 1024**3
BASE_PACKAGES = [
    "python3", "python3-apt", "systemd", "systemd-sysv", "dbus", "sudo", "iproute2", "ca-certificates",
    "gnupg", "curl", "procps", "kmod", "iptables",
]
# The root of the lab's gateway image (lab/build_gateway_image.py): Debian 13, whose HAProxy 3.0 needs its libc. Only
# minbase: the gateway's Dockerfile installs HAProxy on it.
TRIXIE_REPO = "onprem-vllm-lab/trixie"
# A Debian 13 workstation (the bookworm one's packages and hooks): the host of `make test-driver`, where the
# nvidia_driver role installs Debian 13's real driver packages.
TRIXIE_WORKSTATION_REPO = "onprem-vllm-lab/workstation-trixie"
# Everything but SYS_RESOURCE: `--privileged` and `--cap-add ALL` are refused on the CI machines,
# and Docker 20.10 rejects the names BPF, CHECKPOINT_RESTORE and PERFMON.
CAPABILITIES = (
    "AUDIT_CONTROL AUDIT_READ AUDIT_WRITE BLOCK_SUSPEND CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID IPC_LOCK "
    "IPC_OWNER KILL LEASE LINUX_IMMUTABLE MAC_ADMIN MAC_OVERRIDE MKNOD NET_ADMIN NET_BIND_SERVICE NET_BROADCAST "
    "NET_RAW SETFCAP SETGID SETPCAP SETUID SYSLOG SYS_ADMIN SYS_BOOT SYS_CHROOT SYS_MODULE SYS_NICE SYS_PACCT "
    "SYS_PTRACE SYS_RAWIO SYS_TIME SYS_TTY_CONFIG WAKE_ALARM"
).split()
LAB_DIR = Path(__file__).resolve().parent
BUILD_DIR = LAB_DIR / "build"
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SHARE_DIR = BUILD_DIR / "share"  # mounted read-only at /srv/lab-share in every host: the air-gapped "file share"
# `docker save` archives of the lab's images, shared by every checkout on this machine: CI clones the repository anew
# each run, and a 3 GB save takes ~45 s where a hard link takes none. Deleting the folder only costs a save.
ARCHIVE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onprem-vllm-lab" / "archives"


class LabError(Exception):
    """A problem the operator can fix; printed as one line, no traceback."""


def docker(*args: str, check: bool = True, capture: bool = True, stdin=None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["docker", *args], check=False, text=True, stdin=stdin,
                              stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE)
    except FileNotFoundError as exc:
        raise LabError("docker CLI not found: install docker.io (apt-get install -y docker.io)") from exc
    if check and proc.returncode != 0:
        raise LabError(f"docker {' '.join(args[:3])} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc


def omit_host_layers(archive: Path, out: Path, host_layers: list[str]) -> int:
    """Copy a `docker save` archive to out without the layer files of the layers every host already has (host_layers:
    the diff IDs of an image on every host, bottom first; a layer is omitted only where the whole chain below it
    matches). `docker load` opens a layer's file only when the engine lacks that layer (moby's tarexport skips a
    chain ID it has), so the smaller archive loads the same image, in a second instead of unpacking gigabytes, on a
    host that has them; elsewhere the load fails naming the missing file. Returns how many layers were omitted."""
    with tarfile.open(archive) as full:
        manifest = json.load(full.extractfile("manifest.json"))
        if len(manifest) != 1:
            raise LabError(f"{archive}: expected the archive of one image, found {len(manifest)}")
        config = json.load(full.extractfile(manifest[0]["Config"]))
        diff_ids = config["rootfs"]["diff_ids"]
        shared = 0
        while shared < min(len(diff_ids), len(host_layers)) and diff_ids[shared] == host_layers[shared]:
            shared += 1
        omitted = set(manifest[0]["Layers"][:shared])
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as thin:
            for member in full:
                if member.name not in omitted:
                    thin.addfile(member, full.extractfile(member) if member.isfile() else None)
    return shared


def save_image_archive(tag: str, image_id: str, dest: Path, host_layers: list[str] | None = None) -> str:
    """Put `docker save TAG` (0644) at dest and return how: "linked" to this machine's cached archive of the same tag
    and image ID, else "saved" afresh and kept in the cache (older archives of that tag leave it). Where the cache is
    on another filesystem than dest, it is not used. With host_layers, the archive leaves those layers out
    (omit_host_layers): an upgrade archive for hosts that hold the image it was built on."""
    slug = dest.stem
    cached = ARCHIVE_CACHE / f"{slug}.{image_id.split(':')[-1][:16]}{'-delta' if host_layers else ''}.tar"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tar.partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(cached, tmp)
        how = "linked"
    except OSError:  # no cached archive, or another filesystem
        if host_layers:
            full = dest.with_suffix(".tar.full")
            try:
                docker("save", "-o", str(full), tag)
                omit_host_layers(full, tmp, host_layers)
            finally:
                full.unlink(missing_ok=True)
        else:
            docker("save", "-o", str(tmp), tag)
        tmp.chmod(0o644)  # docker save writes 0600; the share is read by every lab host
        how = "saved"
    tmp.replace(dest)
    if how == "saved":
        # Into the cache only where it shares dest's filesystem; only then do the tag's older archives leave it.
        staged = cached.with_suffix(".partial")
        try:
            ARCHIVE_CACHE.mkdir(parents=True, exist_ok=True)
            staged.unlink(missing_ok=True)
            os.link(dest, staged)
        except OSError:
            return how
        for old in ARCHIVE_CACHE.glob("*.tar"):
            if old.name.rsplit(".", 2)[0] == slug:
                old.unlink()
        staged.replace(cached)
    return how


def require_docker() -> dict:
    proc = docker("info", "--format", "{{json .}}", check=False)
    if proc.returncode != 0:
        raise LabError("Docker is not running: start it (systemctl start docker, or `dockerd &` where there is no "
                       "systemd) and retry")
    return json.loads(proc.stdout)


def require_free_space(info: dict, needed: int) -> None:
    root = info.get("DockerRootDir", "/var/lib/docker")
    free = shutil.disk_usage(root if os.path.exists(root) else "/").free
    if free < needed:
        raise LabError(f"only {free / 1024**3:.1f} GiB free under {root}; the lab needs {needed / 1024**3:.1f} GiB: "
                       "free space (docker system prune removes unused images) and retry")


def debian_mirror() -> str:
    """The mirror this machine's apt uses, so the lab works behind the same local mirror or proxy."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def image_recipe(mirror: str, ca_bundle: Path | None, suite: str = "bookworm") -> dict:
    recipe = {"suite": suite, "variant": "minbase", "packages": BASE_PACKAGES, "mirror": mirror,
              "recipe_version": 4}
    if ca_bundle:
        recipe["ca_bundle_sha256"] = hashlib.sha256(ca_bundle.read_bytes()).hexdigest()
    return recipe


def trixie_recipe(mirror: str) -> dict:
    return {"suite": "trixie", "variant": "minbase", "packages": [], "mirror": mirror, "recipe_version": 1}


def image_tag(recipe: dict, repo: str = IMAGE_REPO) -> str:
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{repo}:{digest}"


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def debootstrap_image(recipe: dict, repo: str, options: list[str], changes: list[str]) -> str:
    """The image of a recipe, repo:<recipe hash>: reused where it exists, else its suite's root filesystem made by
    mmdebstrap (with options) and imported with the Dockerfile instructions changes. Returns its tag."""
    info = require_docker()
    tag = image_tag(recipe, repo)
    if image_exists(tag):
        print(f"image {tag} is up to date")
        return tag
    if not shutil.which("mmdebstrap"):
        raise LabError("mmdebstrap not found: apt-get install -y mmdebstrap")
    require_free_space(info, MIN_FREE_BYTES_IMAGE)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd = ["mmdebstrap", f"--variant={recipe['variant']}", *options]
        if recipe["packages"]:
            cmd.append(f"--include={','.join(recipe['packages'])}")
        cmd += [recipe["suite"], str(rootfs), recipe["mirror"]]
        proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
        if proc.returncode != 0:
            raise LabError(f"mmdebstrap failed (mirror {recipe['mirror']}): {proc.stderr.strip().splitlines()[-3:]}")
        # The lab label goes on containers at `docker run`, not on the image: images built FROM this one would pass it
        # on to their containers, and `down` would then remove containers the lab did not create.
        import_args = ["import", "--change", f"LABEL {LAB_LABEL}.base-recipe={tag.split(':')[1]}"]
        for change in changes:
            import_args += ["--change", change]
        docker(*import_args, str(rootfs), tag)
    print(f"built image {tag} in {time.monotonic() - started:.0f} s")
    return tag


def build_image(ca_bundle: Path | None, suite: str = "bookworm") -> str:
    hooks = [
        # A container has no console or udev; these units only slow boot or fail there.
        'chroot "$1" systemctl mask getty@tty1.service systemd-udevd.service systemd-logind.service '
        "systemd-remount-fs.service sys-kernel-config.mount console-getty.service",
        'echo "onprem-lab" > "$1/etc/hostname"',
    ]
    if ca_bundle:
        hooks.append(f'cp {ca_bundle} "$1/usr/local/share/ca-certificates/lab-extra.crt" && '
                     'chroot "$1" update-ca-certificates')
    # Keep the apt lists: with an empty lists folder, Ansible's apt cache_valid_time sees a "fresh" cache.
    options = ["--skip=cleanup/apt/lists", *(f"--customize-hook={hook}" for hook in hooks)]
    repo = IMAGE_REPO if suite == "bookworm" else TRIXIE_WORKSTATION_REPO
    tag = debootstrap_image(image_recipe(debian_mirror(), ca_bundle, suite), repo, options,
                            ['CMD ["/lib/systemd/systemd"]', "ENV container=docker"])
    docker("tag", tag, f"{repo}:latest")
    return tag


def build_trixie_root() -> str:
    """The gateway image's Debian 13 root, built once per recipe; returns its tag."""
    return debootstrap_image(trixie_recipe(debian_mirror()), TRIXIE_REPO, [], ['CMD ["/bin/bash"]'])


def remove_stale_tags(repo: str, keep: set[str]) -> None:
    """Untag (and so delete) the lab's images of replaced recipes: each serving image is 4 GB. Docker refuses to
    delete an image a container or a child image still uses; that one stays until a later run."""
    refs = docker("image", "ls", repo, "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    for ref in refs:
        if ref not in keep and not ref.endswith(":<none>") and docker("rmi", ref, check=False).returncode == 0:
            print(f"removed stale image {ref}")


def lab_containers() -> dict[str, dict]:
    proc = docker("ps", "-a", "--filter", f"label={LAB_LABEL}", "--format", "{{json .}}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return {row["Names"]: row for row in rows}


def ensure_network(subnet: str) -> None:
    proc = docker("network", "inspect", NETWORK, check=False)
    if proc.returncode == 0:
        net = json.loads(proc.stdout)[0]
        if net.get("Labels", {}).get(LAB_LABEL) != "1":
            raise LabError(f"a Docker network named {NETWORK} exists but was not made by the lab: remove or rename it")
        return
    wanted = ipaddress.ip_network(subnet)
    for name in docker("network", "ls", "--format", "{{.Name}}").stdout.split():
        for cfg in (json.loads(docker("network", "inspect", name).stdout)[0].get("IPAM", {}).get("Config") or []):
            if cfg.get("Subnet") and ipaddress.ip_network(cfg["Subnet"]).overlaps(wanted):
                raise LabError(f"subnet {subnet} is taken by Docker network {name}: pass --subnet with a free range")
    docker("network", "create", "--label", f"{LAB_LABEL}=1", "--subnet", subnet, NETWORK)


def host_plan(workstations: int, gateway: bool, subnet: str) -> list[dict]:
    net = ipaddress.ip_network(subnet)
    plan = [{"name": f"{HOST_PREFIX}ws{i}", "role": "workstation", "ip": str(net.network_address + 10 + i)}
            for i in range(1, workstations + 1)]
    if gateway:
        plan.append({"name": f"{HOST_PREFIX}gw", "role": "gateway", "ip": str(net.network_address + 5)})
    return plan


def systemd_host_args(name: str, volume: str) -> list[str]:
    """`docker run` options of a systemd host with its own Docker engine on `volume` (lab hosts, the image store)."""
    args = ["--name", name, "--hostname", name,
            "--cap-drop", "ALL", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "--shm-size", "1g", "--stop-signal", "SIGRTMIN+3",
            "-v", f"{volume}:/var/lib/docker",
            "-v", f"{SHARE_DIR}:/srv/lab-share:ro",
            # dpkg without an fsync per file on a throwaway host.
            "-v", f"{LAB_DIR / 'dpkg-unsafe-io.cfg'}:/etc/dpkg/dpkg.cfg.d/lab-unsafe-io:ro"]
    for cap in CAPABILITIES:
        args += ["--cap-add", cap]
    return args


def run_host(host: dict, image: str) -> None:
    volume = f"{host['name']}-docker"
    docker("volume", "create", "--label", f"{LAB_LABEL}=1", volume)
    docker("run", "-d", *systemd_host_args(host["name"], volume),
           "--label", f"{LAB_LABEL}=1", "--label", f"{ROLE_LABEL}={host['role']}",
           "--network", NETWORK, "--ip", host["ip"], image)


def wait_for_systemd(name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        proc = docker("exec", name, "systemctl", "is-system-running", check=False)
        state = proc.stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(1)
    raise LabError(f"{name}: systemd did not finish booting in {timeout:.0f} s (state {state!r}); "
                   f"see `docker logs {name}`")


def up(workstations: int, gateway: bool, subnet: str, ca_bundle: Path | None, seed: bool = False) -> None:
    if not 1 <= workstations <= MAX_WORKSTATIONS:
        raise LabError(f"--workstations must be 1..{MAX_WORKSTATIONS}, got {workstations}")
    require_docker()
    plan = host_plan(workstations, gateway, subnet)
    existing = lab_containers()
    # Every refusal comes before anything is built or created.
    for host in plan:
        other = docker("container", "inspect", host["name"], check=False)
        if other.returncode == 0 and host["name"] not in existing:
            raise LabError(f"a container named {host['name']} exists but is not a lab host: rename or remove it "
                           "(the lab never deletes containers it did not create)")
    ensure_network(subnet)
    image = build_image(ca_bundle)
    SHARE_DIR.mkdir(parents=True, exist_ok=True)
    created = []
    for host in plan:
        row = existing.get(host["name"])
        if row is None:
            run_host(host, image)
            created.append(host)
            print(f"{host['name']}: created ({host['role']}, {host['ip']})")
        elif row["State"] != "running":
            docker("start", host["name"])
            print(f"{host['name']}: started")
        else:
            print(f"{host['name']}: running")
    for host in plan:
        wait_for_systemd(host["name"])
    new_workstations = [host["name"] for host in created if host["role"] == "workstation"]
    if seed and new_workstations:
        # The image store is built on this module (it imports labctl), so it runs as its own command, the one
        # molecule's prepare_seed.yml runs, instead of being imported back here. Flushed first: our lines come first.
        sys.stdout.flush()
        argv = [sys.executable, str(LAB_DIR / "image_store.py"), "seed", *new_workstations]
        if subprocess.run(argv, check=False).returncode != 0:
            raise LabError(f"seeding {', '.join(new_workstations)} failed: see image_store's message above")
    extra = sorted(set(existing) - {host["name"] for host in plan})
    if extra:
        print(f"note: lab hosts outside this plan are left as they are: {', '.join(extra)} (`labctl.py down` removes "
              "every lab host)")


def down() -> None:
    require_docker()
    for name in lab_containers():
        docker("rm", "-f", "-v", name)
        print(f"{name}: removed")
    for vol in docker("volume", "ls", "-q", "--filter", f"label={LAB_LABEL}").stdout.split():
        docker("volume", "rm", vol)
        print(f"volume {vol}: removed")
    proc = docker("network", "inspect", NETWORK, check=False)
    if proc.returncode == 0 and json.loads(proc.stdout)[0].get("Labels", {}).get(LAB_LABEL) == "1":
        docker("network", "rm", NETWORK)
        print(f"network {NETWORK}: removed")


def status() -> None:
    require_docker()
    for name, row in sorted(lab_containers().items()):
        print(f"{name}\t{row['State']}\t{row['Status']}")


def main(argv: list[str] | None = None) -> int:
    default_ca = DEFAULT_CA_BUNDLE if DEFAULT_CA_BUNDLE.is_file() else None
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ca_help = ("a CA bundle to trust inside the lab (sites behind TLS-inspecting proxies need it for HTTPS); default: "
               f"{DEFAULT_CA_BUNDLE} when it exists, the same default as build_artifacts.py so both share one base image")
    p_image = sub.add_parser("image", help="build or reuse the workstation base image")
    p_image.add_argument("--ca-bundle", type=Path, default=default_ca, help=ca_help)
    p_image.add_argument("--no-ca-bundle", dest="ca_bundle", action="store_const", const=None)
    p_image.add_argument("--suite", choices=["bookworm", "trixie"], default="bookworm",
                         help=f"trixie: the Debian 13 workstation {TRIXIE_WORKSTATION_REPO}:latest (make test-driver)")
    p_up = sub.add_parser("up", help="create or start the lab hosts (idempotent)")
    p_up.add_argument("--workstations", type=int, default=int(os.environ.get("LAB_WORKSTATIONS", "2")))
    p_up.add_argument("--gateway", action="store_true", help="also start a gateway host")
    p_up.add_argument("--subnet", default=os.environ.get("LAB_SUBNET", DEFAULT_SUBNET))
    p_up.add_argument("--seed", action="store_true",
                      help="give new workstations the serving image from the image store (lab/image_store.py)")
    p_up.add_argument("--ca-bundle", type=Path, default=default_ca, help=ca_help)
    p_up.add_argument("--no-ca-bundle", dest="ca_bundle", action="store_const", const=None)
    sub.add_parser("down", help="remove every lab host, its volume and the lab network (nothing else)")
    sub.add_parser("status", help="list lab hosts")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "ca_bundle", None) and not args.ca_bundle.is_file():
            raise LabError(f"--ca-bundle {args.ca_bundle}: no such file")
        if args.command == "image":
            build_image(args.ca_bundle, args.suite)
        elif args.command == "up":
            up(args.workstations, args.gateway, args.subnet, args.ca_bundle, args.seed)
        elif args.command == "down":
            down()
        else:
            status()
    except LabError as exc:
        print(f"labctl: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
