# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run one of the collection's modules as Ansible runs it (a process given its arguments as JSON) and print the
result as one JSON line with the process's wall time: for recording what the modules return on a real GPU host.

  python3 tests/device/run_module.py gpu_topology_info '{"backend": "nvml", "tensor_parallel_size": 2}'
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def main():
    module, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, ".collections")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.onprem.vllm.plugins.modules." + module,
                           handle.name], capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - started
    os.unlink(handle.name)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {"failed": True, "msg": "no JSON from the module", "stdout": proc.stdout[-2000:],
                  "stderr": proc.stderr[-2000:]}
    result["_module"], result["_args"], result["_process_wall_s"] = module, args, round(wall, 3)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
