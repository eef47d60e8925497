# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start or stop a vLLM server from the container spec the vllm_server role renders (`_vllm_server_container_spec`),
without Docker (the lent GPU machine has none). What Docker would do is done by hand, and nothing else changes:
  - the image's entrypoint `vllm serve` is `python3 -c 'from vllm.entrypoints.cli.main import main' serve ...` with
    the spec's command as its arguments, unchanged;
  - the spec's environment is the server's, with the site of vLLM (benchmarks/gpu_compare/pack.sh) appended to its
    PYTHONPATH (in the image, vLLM is in the system's site-packages) and the lent machine's NVLink-multicast guards;
  - each volume host:container[:ro] becomes a link at the container path to the host path (no read-only, no mount
    namespace: the server sees the same files at the same paths);
  - the GPUs the spec assigns by UUID become CUDA_VISIBLE_DEVICES (Docker's --gpus device=UUID);
  - no port is published: the server listens on the container port (the spec's container_port, in its command), where
    Docker would publish it as the spec's port; the checks are given that port.
`start` writes the process group's id to --pid; `stop` sends SIGTERM to the group (Docker's stop), then SIGKILL.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ENTRYPOINT = [sys.executable, "-c", "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; "
              "sys.exit(main())", "serve"]
# Set on every lent GPU machine (the device tool's KINDS.md): keep them for any program started there.
DEVICE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
              # FlashInfer is not in the pack: vLLM then samples with PyTorch.
              "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1"}


def link_volumes(volumes: list[str]) -> list[str]:
    """Each host:container[:ro] volume as a link at the container path; returns what was linked, in words."""
    done = []
    for volume in volumes:
        host, container = volume.split(":")[:2]
        if os.path.realpath(container) == os.path.realpath(host):
            continue
        if os.path.islink(container):
            os.unlink(container)
        elif os.path.isdir(container) and not os.listdir(container):
            os.rmdir(container)
        elif os.path.exists(container):
            raise SystemExit(f"{container} exists and is not a link: not replacing it")
        os.makedirs(os.path.dirname(container), exist_ok=True)
        os.symlink(host, container)
        done.append(f"{container} -> {host}")
    return done


def server_env(spec: dict, site: str) -> dict:
    env = {key: str(value) for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG", "TERM")}
    env.update({key: str(value) for key, value in spec.get("env", {}).items()})
    env["PYTHONPATH"] = ":".join(part for part in (env.get("PYTHONPATH", ""), site) if part)
    if spec.get("gpu_uuids"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec["gpu_uuids"])
    env.update(DEVICE_ENV)
    return env


def start(args) -> int:
    with open(args.spec, encoding="utf-8") as handle:
        spec = json.load(handle)
    linked = link_volumes(spec.get("volumes", []))
    env = server_env(spec, args.site)
    argv = ENTRYPOINT + [str(arg) for arg in spec["command"]]
    with open(args.log, "w", encoding="utf-8") as log:
        # What ran, as a reader of the log needs it: the argv and the environment's names (values of the spec's
        # environment are no secret: the key is a file), the links standing in for the volumes.
        log.write("# argv: " + json.dumps(argv) + "\n")
        log.write("# env: " + json.dumps(env, sort_keys=True) + "\n")
        log.write("# volumes as links: " + json.dumps(linked) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd="/")
    with open(args.pid, "w", encoding="utf-8") as handle:
        handle.write(f"{proc.pid}\n")
    print(json.dumps({"pid": proc.pid, "argv": argv, "linked": linked}))
    return 0


def stop(args) -> int:
    try:
        with open(args.pid, encoding="utf-8") as handle:
            pgid = int(handle.read().strip())
    except (OSError, ValueError):
        return 0
    for sig, wait in ((signal.SIGTERM, args.timeout), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    os.unlink(args.pid)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--spec", help="the role's container spec as JSON (start)")
    parser.add_argument("--site", default="", help="the folder holding vLLM's package (start)")
    parser.add_argument("--log", help="the server's output (start)")
    parser.add_argument("--pid", required=True, help="where the process group's id is kept")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (stop)")
    args = parser.parse_args(argv)
    return start(args) if args.action == "start" else stop(args)


if __name__ == "__main__":
    sys.exit(main())
