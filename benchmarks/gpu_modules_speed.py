# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time onprem.vllm.gpu_topology_info and onprem.vllm.gpu_health_info.

Usage (from the repository root):
    .venv/bin/python benchmarks/gpu_modules_speed.py [--repeat 5] [--json out.json] [--no-ansible]

Cases:
  * fixture / nvidia-smi: the real H200 outputs in tests/unit/fixtures/gpu/h200-x1 replayed by the fake nvidia-smi;
  * live / nvml and live / nvidia-smi: only when a GPU answers on this machine (nvidia-smi -L succeeds).

Three numbers per case (medians over --repeat runs):
  * in-module: the module's own elapsed_s (collection and checks only);
  * process:   wall time of running the module file as a process (Python start, imports, work) - the cost per host;
  * ansible:   wall time of one `ansible localhost -m ...` call (adds the controller's fixed start-up cost; one run).
Targets (issue 4): < 1 s per host with NVML, < 3 s with the nvidia-smi backend.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "gpu")
FAKE = os.path.join(FIXTURES, "fake-nvidia-smi")
H200 = os.path.join(FIXTURES, "h200-x1")
XID_LOG = os.path.join(FIXTURES, "kernel-logs", "xid-mixed.log")
MODULES = {
    "gpu_topology_info": os.path.join(ROOT, "plugins", "modules", "gpu_topology_info.py"),
    "gpu_health_info": os.path.join(ROOT, "plugins", "modules", "gpu_health_info.py"),
}


def collections_path():
    """A folder holding ansible_collections/onprem/vllm -> ROOT (the checkout's own .collections when present)."""
    own = os.path.join(ROOT, ".collections")
    if os.path.isdir(os.path.join(own, "ansible_collections", "onprem", "vllm")):
        return own
    tmp = tempfile.mkdtemp(prefix="gpu-bench-")
    os.makedirs(os.path.join(tmp, "ansible_collections", "onprem"))
    os.symlink(ROOT, os.path.join(tmp, "ansible_collections", "onprem", "vllm"))
    return tmp


def run_module_process(module, args, env):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
        path = handle.name
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, MODULES[module], path], env=env, check=False, capture_output=True, text=True)
        wall = time.monotonic() - started
    finally:
        os.unlink(path)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit("%s did not return JSON: %s %s" % (module, proc.stdout[-500:], proc.stderr[-500:]))
    return wall, result


def run_ansible_cli(module, args, env):
    ansible = shutil.which("ansible", path=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    if not ansible:
        return None
    arg_text = " ".join("%s=%s" % (k, json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in args.items())
    cmd = [ansible, "localhost", "-c", "local", "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
           "-m", "onprem.vllm.%s" % module]
    if arg_text:
        cmd += ["-a", arg_text]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    return wall if proc.returncode == 0 else None


def gpu_present():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    return subprocess.run([smi, "-L"], check=False, capture_output=True).returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--no-ansible", action="store_true", help="skip the ansible CLI timing")
    parser.add_argument("--no-live", action="store_true", help="skip live cases even when a GPU is present")
    opts = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = collections_path() + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", env["PYTHONPATH"].split(os.pathsep)[0])
    cases = []
    fixture_env = dict(env, FAKE_NVIDIA_SMI_CASE=H200)
    for module in MODULES:
        args = {"backend": "nvidia-smi", "nvidia_smi_path": FAKE}
        if module == "gpu_health_info":
            args.update(kernel_log_path=XID_LOG if os.path.exists(XID_LOG) else "/dev/null", check_acs=False)
        else:
            args["tensor_parallel_size"] = 1
        cases.append(("fixture h200-x1", module, "nvidia-smi", args, fixture_env))
    if not opts.no_live and gpu_present():
        for module in MODULES:
            for backend in ("nvml", "nvidia-smi"):
                args = {"backend": backend}
                if module == "gpu_topology_info":
                    args["tensor_parallel_size"] = 1
                cases.append(("live", module, backend, args, env))
    rows = []
    for source, module, backend, args, case_env in cases:
        walls, inner = [], []
        result = None
        for _run in range(opts.repeat):
            wall, result = run_module_process(module, args, case_env)
            walls.append(wall)
            inner.append(result.get("elapsed_s") or 0.0)
        cli = None if opts.no_ansible else run_ansible_cli(module, args, case_env)
        rows.append({
            "source": source, "module": module, "backend": result.get("backend", backend),
            "status": result.get("status"), "failed": bool(result.get("failed")),
            "in_module_s": round(statistics.median(inner), 4), "process_s": round(statistics.median(walls), 4),
            "ansible_cli_s": round(cli, 3) if cli is not None else None, "repeat": opts.repeat,
        })
    header = "%-16s %-13s %-11s %-7s %10s %10s %12s" % ("source", "module", "backend", "status", "in-module", "process", "ansible-cli")
    print(header)
    print("-" * len(header))
    for row in rows:
        print("%-16s %-13s %-11s %-7s %9.3fs %9.3fs %12s" % (
            row["source"], row["module"], row["backend"], row["status"] if not row["failed"] else "FAILED",
            row["in_module_s"], row["process_s"], "%.3fs" % row["ansible_cli_s"] if row["ansible_cli_s"] else "-"))
    if opts.json:
        with open(opts.json, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0 if not any(r["failed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
