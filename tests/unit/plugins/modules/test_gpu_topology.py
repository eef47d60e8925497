# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the real module through the ansible CLI (local connection) with the fake nvidia-smi replaying each case."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures", "gpu")
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
if not os.path.exists(ANSIBLE):  # ansible installed apart from this interpreter
    ANSIBLE = shutil.which("ansible") or ANSIBLE


def run_module(module, args, case=None, check=False):
    """Returns the module's result dict (ansible's json callback)."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_DEPRECATION_WARNINGS="0")
    if case:
        env["FAKE_NVIDIA_SMI_CASE"] = os.path.join(FIXTURES, case)
    cmd = [ANSIBLE, "localhost", "-c", "local", "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable,
           "-m", "onprem.vllm.%s" % module, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip(), "ansible printed nothing (rc=%s): %s" % (proc.returncode, proc.stderr[-2000:])
    data = json.loads(proc.stdout)
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


def smi(case, **extra):
    args = {"backend": "nvidia-smi", "nvidia_smi_path": FAKE_SMI}
    args.update(extra)
    return run_module("gpu_topology", args, case)


def test_h200_real_output():
    result = smi("h200-x1", tensor_parallel_size=1)
    assert result["changed"] is False and result["status"] == "ok"
    assert result["driver_version"] == "580.159.04" and result["cuda_driver_version"] == "13.0"
    gpu = result["gpus"][0]
    assert gpu["uuid"] == "GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"
    assert gpu["memory_total_bytes"] == 150754820096
    assert gpu["numa_node"] == 0 and gpu["compute_capability"] == "9.0"
    assert result["plan"]["selected_uuids"] == [gpu["uuid"]]
    assert result["plan"]["gpu_memory_bytes"] == 150754820096


def test_live_capture_replays_to_the_live_facts():
    """Replaying the raw outputs captured on the H200 gives what the module returned live there (nvidia-smi backend)."""
    with open(os.path.join(FIXTURES, "h200-x1", "live-2026-11-29", "facts.json")) as handle:
        live = json.load(handle)["gpu_topology/nvidia-smi"]
    result = smi("h200-x1/live-2026-11-29", tensor_parallel_size=1)
    for key in ("status", "driver_version", "cuda_driver_version", "gpu_count", "gpus", "links", "nvswitch"):
        assert result[key] == live[key], key
    assert result["plan"]["selected_uuids"] == live["plan"]["selected_uuids"] == ["GPU-5c942d57-d31d-83af-4731-0fced0ecea57"]


def test_dual_5090_gns_plan():
    result = smi("dual-5090-gns", tensor_parallel_size=2)
    assert result["links"]["0-1"]["p2p_read"] == "GNS"
    assert result["links"]["0-1"]["p2p_write"] is None  # not recorded in the source
    assert result["plan"]["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert any("topo -p2p w" in w for w in result["warnings_list"])


def test_dgx_nvswitch_and_numa():
    result = smi("dgx-h100-nvswitch", tensor_parallel_size=4)
    assert result["gpu_count"] == 8 and result["nvswitch"]["present"] is True
    assert result["plan"]["selected_indices"] == [0, 1, 2, 3]


def test_quad_3090_nvlink_pair():
    result = smi("quad-3090-nvlink-pairs", tensor_parallel_size=2)
    assert result["plan"]["selected_indices"] == [0, 2]
    assert result["plan"]["min_compute_capability"] == "8.6"


def test_two_socket():
    result = smi("two-socket-3090-sys")
    assert [g["numa_node"] for g in result["gpus"]] == [None, 1]
    assert "plan" not in result


def test_check_mode_is_read_only():
    result = run_module("gpu_topology", {"backend": "nvidia-smi", "nvidia_smi_path": FAKE_SMI}, "h200-x1", check=True)
    assert result["changed"] is False and result["gpu_count"] == 1


# ---------- bad input and no GPU: clear messages, no traceback ----------

def test_tp_larger_than_gpus_is_a_clear_plan_message():
    result = smi("h200-x1", tensor_parallel_size=4)
    assert not result.get("failed")
    assert result["plan"]["ok"] is False
    assert "tensor_parallel_size 4 needs 4 GPUs" in result["plan"]["msg"]


def test_missing_uuid_is_a_clear_plan_message():
    result = smi("h200-x1", tensor_parallel_size=1, gpu_uuids=["GPU-does-not-exist"])
    assert result["plan"]["ok"] is False and "GPU-does-not-exist" in result["plan"]["msg"]


@pytest.mark.parametrize("case,status", [("driver-mismatch", "driver_library_mismatch"), ("no-driver", "no_driver")])
def test_driver_failures(case, status):
    result = smi(case, tensor_parallel_size=2)
    assert not result.get("failed")
    assert result["status"] == status and result["gpus"] == [] and result["gpu_count"] == 0
    assert result["plan"]["ok"] is False


def test_no_gpu_host_auto_backend():
    """This machine has no NVIDIA driver: auto must answer gpus=[] with a message, not fail."""
    result = run_module("gpu_topology", {"backend": "auto"})
    if result.get("gpu_count"):
        pytest.skip("an NVIDIA GPU is present here")
    assert not result.get("failed")
    assert result["gpus"] == [] and result["status"] in ("no_driver", "no_nvml") and result["msg"]


def test_nonexistent_smi_path():
    result = run_module("gpu_topology", {"backend": "nvidia-smi", "nvidia_smi_path": "/nonexistent/nvidia-smi"})
    assert result["failed"] and result["msg"] == "nvidia_smi_path /nonexistent/nvidia-smi does not exist"
    assert "Traceback" not in str(result.get("exception", ""))  # ansible-core 2.21 adds a placeholder key


def test_bad_backend_choice():
    result = run_module("gpu_topology", {"backend": "rocm"})
    assert result["failed"] and "backend" in result["msg"]


X2 = os.path.join(FIXTURES, "h200-x2")
X2_LIVE = os.path.join(X2, "live-2026-11-30")
X2_UUIDS = ["GPU-b498cf63-9a07-5c12-d36f-c97d76088490", "GPU-dbc5aa98-63a5-3494-39cf-05b5b2dc9ccb"]


def x2_live_results():
    """What the modules returned on the two-H200 machine, keyed by (module, backend, tensor_parallel_size)."""
    with open(os.path.join(X2_LIVE, "facts.jsonl")) as handle:
        rows = [json.loads(line) for line in handle]
    return {(r["_module"], r["_args"]["backend"], r["_args"].get("tensor_parallel_size")): r for r in rows}


def smi_matrix(name):
    """nvidia-smi's own matrix from a raw capture, read independently of the module's parser: {"i-j": value}."""
    with open(os.path.join(X2, name)) as handle:
        rows = [line.replace("\x1b[4m", "").replace("\x1b[0m", "").split() for line in handle]
    header = next(r for r in rows if r and r[0] == "GPU0")
    cells = {}
    for row in rows[rows.index(header) + 1:]:
        if not row or not row[0].startswith("GPU"):
            break
        for col, value in zip(header, row[1:]):
            if col != row[0]:
                cells["%s-%s" % (row[0][3:], col[3:])] = value
    return cells


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
def test_two_h200_links_and_p2p_match_nvidia_smi_for_every_pair(backend):
    # The NVML backend never reads nvidia-smi: this compares two independent readings of the same machine.
    live = x2_live_results()[("gpu_topology", backend, None)]
    names = ("topo-m.txt", "topo-p2p-r.txt", "topo-p2p-w.txt", "topo-p2p-n.txt")
    topo, reads, writes, nvlinks = (smi_matrix(name) for name in names)
    pairs = ["%d-%d" % (i, j) for i in range(live["gpu_count"]) for j in range(i + 1, live["gpu_count"])]
    assert live["gpu_count"] == 2 and sorted(live["links"]) == pairs
    for pair in pairs:
        i, j = pair.split("-")
        assert topo[pair] == topo["%s-%s" % (j, i)] == live["links"][pair]["type"] == "NV18"
        assert live["links"][pair]["nvlink_count"] == 18
        assert reads[pair] == live["links"][pair]["p2p_read"] == "OK"
        assert writes[pair] == live["links"][pair]["p2p_write"] == "OK"
        assert nvlinks[pair] == live["links"][pair]["p2p_nvlink"] == "OK"
    assert live["nvswitch"]["present"] is True


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
def test_two_h200_gpu_sets_for_each_tensor_parallel_size(backend):
    live = x2_live_results()
    assert live[("gpu_topology", backend, 1)]["plan"]["selected_indices"] == [0]
    assert live[("gpu_topology", backend, 1)]["plan"]["nccl_env"] == {}
    both = live[("gpu_topology", backend, 2)]["plan"]
    assert both["ok"] and both["selected_uuids"] == X2_UUIDS
    # NVLink with P2P OK: P2P stays on and vLLM's custom all-reduce is kept (NCCL used P2P/CUMEM there, 0 NVLS channels).
    assert both["nccl_env"] == {"NCCL_P2P_DISABLE": "0"} and both["disable_custom_all_reduce"] is False
    assert both["gpu_memory_bytes"] == 150754820096
    three = live[("gpu_topology", backend, 3)]["plan"]
    assert not three["ok"] and three["msg"].startswith("tensor_parallel_size 3 needs 3 GPUs, but only the 2 GPU(s)")


def test_two_h200_capture_replays_to_the_live_facts():
    """Replaying the raw outputs captured on the two-H200 machine gives what the module returned live there."""
    live = x2_live_results()[("gpu_topology", "nvidia-smi", 2)]
    result = smi("h200-x2", tensor_parallel_size=2)
    for key in ("status", "driver_version", "cuda_driver_version", "gpu_count", "gpus", "links", "nvswitch", "plan"):
        assert result[key] == live[key], key
