# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the real module through the ansible CLI (local connection) with the fake nvidia-smi replaying each case."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_select

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu"))
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")
SMI_ARGS = {"backend": "nvidia-smi", "nvidia_smi_path": FAKE_SMI}
# The live captures (live-*/facts.json*) key this module's results by the name it ran under there.
CAPTURED_AS = "gpu_topology"


def case_env(case):
    return {"FAKE_NVIDIA_SMI_CASE": os.path.join(FIXTURES, case)}


@pytest.fixture
def smi(run_module):
    """smi(case, **args): the module with the nvidia-smi backend, the fake nvidia-smi replaying the case."""
    def run(case, **extra):
        return run_module("gpu_topology_info", dict(SMI_ARGS, **extra), case_env(case))
    return run


def test_h200_real_output(smi):
    result = smi("h200-x1", tensor_parallel_size=1)
    assert result["changed"] is False and result["status"] == "ok"
    assert result["driver_version"] == "580.159.04" and result["cuda_driver_version"] == "13.0"
    gpu = result["gpus"][0]
    assert gpu["uuid"] == "GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"
    assert gpu["memory_total_bytes"] == 150754820096
    assert gpu["numa_node"] == 0 and gpu["compute_capability"] == "9.0"
    assert result["plan"]["selected_uuids"] == [gpu["uuid"]]
    assert result["plan"]["gpu_memory_bytes"] == 150754820096


def test_live_capture_replays_to_the_live_facts(smi):
    """Replaying the raw outputs captured on the H200 gives what the module returned live there (nvidia-smi backend)."""
    with open(os.path.join(FIXTURES, "h200-x1", "live-2026-11-29", "facts.json")) as handle:
        live = json.load(handle)[CAPTURED_AS + "/nvidia-smi"]
    result = smi("h200-x1/live-2026-11-29", tensor_parallel_size=1)
    for key in ("status", "driver_version", "cuda_driver_version", "gpu_count", "gpus", "links", "nvswitch"):
        assert result[key] == live[key], key
    assert result["plan"]["selected_uuids"] == live["plan"]["selected_uuids"] == ["GPU-5c942d57-d31d-83af-4731-0fced0ecea57"]


def test_dual_5090_gns_plan(smi):
    result = smi("dual-5090-gns", tensor_parallel_size=2)
    assert result["links"]["0-1"]["p2p_read"] == "GNS"
    assert result["links"]["0-1"]["p2p_write"] is None  # not recorded in the source
    assert result["plan"]["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert any("topo -p2p w" in w for w in result["warnings_list"])


def test_dgx_nvswitch_and_numa(smi):
    result = smi("dgx-h100-nvswitch", tensor_parallel_size=4)
    assert result["gpu_count"] == 8 and result["nvswitch"]["present"] is True
    assert result["plan"]["selected_indices"] == [0, 1, 2, 3]


def test_quad_3090_nvlink_pair(smi):
    result = smi("quad-3090-nvlink-pairs", tensor_parallel_size=2)
    assert result["plan"]["selected_indices"] == [0, 2]
    assert result["plan"]["min_compute_capability"] == "8.6"


def test_two_socket(smi):
    result = smi("two-socket-3090-sys")
    assert [g["numa_node"] for g in result["gpus"]] == [None, 1]
    assert "plan" not in result


def test_check_apply_and_again_report_the_same_read_only_facts(run_module):
    args = dict(SMI_ARGS, tensor_parallel_size=2)
    check, apply, again = (run_module("gpu_topology_info", args, case_env("h200-x2"), check=mode) for mode in (True, False, False))
    for result in (check, apply, again):
        assert result["changed"] is False and not result.get("failed"), result.get("msg")
        assert result["gpu_count"] == 2 and result["plan"]["ok"]
    for key in ("gpus", "links", "nvswitch", "plan"):
        assert check[key] == apply[key] == again[key], key


# ---------- bad input and no GPU: clear messages, no traceback ----------

def test_tp_larger_than_gpus_is_a_clear_plan_message(smi):
    result = smi("h200-x1", tensor_parallel_size=4)
    assert not result.get("failed")
    assert result["plan"]["ok"] is False
    assert "tensor_parallel_size 4 needs 4 GPUs" in result["plan"]["msg"]


def test_missing_uuid_is_a_clear_plan_message(smi):
    result = smi("h200-x1", tensor_parallel_size=1, gpu_uuids=["GPU-does-not-exist"])
    assert result["plan"]["ok"] is False and "GPU-does-not-exist" in result["plan"]["msg"]


@pytest.mark.parametrize("case,status", [("driver-mismatch", "driver_library_mismatch"), ("no-driver", "no_driver")])
def test_driver_failures(case, status, smi):
    result = smi(case, tensor_parallel_size=2)
    assert not result.get("failed")
    assert result["status"] == status and result["gpus"] == [] and result["gpu_count"] == 0
    assert result["plan"]["ok"] is False


def test_no_gpu_host_auto_backend(run_module):
    """This machine has no NVIDIA driver: auto must answer gpus=[] with a message, not fail."""
    result = run_module("gpu_topology_info", {"backend": "auto"})
    if result.get("gpu_count"):
        pytest.skip("an NVIDIA GPU is present here")
    assert not result.get("failed")
    assert result["gpus"] == [] and result["status"] in ("no_driver", "no_nvml") and result["msg"]


def test_nonexistent_smi_path(run_module):
    result = run_module("gpu_topology_info", {"backend": "nvidia-smi", "nvidia_smi_path": "/nonexistent/nvidia-smi"})
    assert result["failed"] and result["msg"] == "nvidia_smi_path /nonexistent/nvidia-smi does not exist"
    assert "Traceback" not in str(result.get("exception", ""))  # ansible-core 2.21 adds a placeholder key


def test_bad_backend_choice(run_module):
    result = run_module("gpu_topology_info", {"backend": "rocm"})
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


def test_two_h200_links_and_p2p_parse_to_nvidia_smis_matrices_and_nvmls_reading(smi):
    """The raw capture through the module (nvidia-smi backend): each pair's link and P2P status is what the matrices
    say (read here by a separate, simpler reader) and what the NVML backend, which never runs nvidia-smi, read live
    on the same machine."""
    result = smi("h200-x2")
    nvml = x2_live_results()[(CAPTURED_AS, "nvml", None)]
    topo, reads, writes, nvlinks = (smi_matrix(name) for name in
                                    ("topo-m.txt", "topo-p2p-r.txt", "topo-p2p-w.txt", "topo-p2p-n.txt"))
    assert result["status"] == "ok" and result["gpu_count"] == 2 and sorted(result["links"]) == ["0-1"]
    link = result["links"]["0-1"]
    assert link["type"] == topo["0-1"] == topo["1-0"] == "NV18" and link["nvlink_count"] == 18
    assert link["p2p_read"] == reads["0-1"] == "OK"
    assert link["p2p_write"] == writes["0-1"] == "OK"
    assert link["p2p_nvlink"] == nvlinks["0-1"] == "OK"
    assert result["links"] == nvml["links"]
    assert result["nvswitch"]["present"] is nvml["nvswitch"]["present"] is True
    assert [g["uuid"] for g in result["gpus"]] == [g["uuid"] for g in nvml["gpus"]] == X2_UUIDS


def recorded_topology(backend):
    """The GPUs and links a backend read on the two-H200 machine (its live record), as gpu_select takes them."""
    if backend == "nvml":
        live = x2_live_results()[(CAPTURED_AS, "nvml", None)]
        return {"gpus": live["gpus"], "links": live["links"]}
    return None  # nvidia-smi: the raw capture replayed through the module


@pytest.mark.parametrize("backend", ["nvml", "nvidia-smi"])
def test_two_h200_gpu_sets_for_each_tensor_parallel_size(backend, smi):
    """Each backend's reading of the machine through the decision code: which GPUs, which NCCL settings."""
    def plan(tp):
        topology = recorded_topology(backend)
        return gpu_select.plan(topology, tp) if topology else smi("h200-x2", tensor_parallel_size=tp)["plan"]

    one, both, three = plan(1), plan(2), plan(3)
    assert one["ok"] and one["selected_indices"] == [0] and one["nccl_env"] == {}
    assert both["ok"] and both["selected_uuids"] == X2_UUIDS
    # NVLink with P2P OK: P2P stays on and vLLM's custom all-reduce is kept; under exactly these settings
    # (nccl-env.txt) NCCL's all-reduce ran there over P2P/CUMEM with the right sum (nccl-allreduce.log).
    with open(os.path.join(X2_LIVE, "nccl-env.txt")) as handle:
        measured_env = dict(line.strip().split("=", 1) for line in handle if line.strip())
    assert both["nccl_env"] == measured_env == {"NCCL_P2P_DISABLE": "0"}
    assert both["disable_custom_all_reduce"] is False
    assert both["gpu_memory_bytes"] == 150754820096
    assert not three["ok"] and three["msg"].startswith("tensor_parallel_size 3 needs 3 GPUs, but only the 2 GPU(s)")
    live = x2_live_results()
    for tp, got in ((1, one), (2, both), (3, three)):  # and what the module decided live there
        assert got == live[(CAPTURED_AS, backend, tp)]["plan"], tp


def test_two_h200_capture_replays_to_the_live_facts(smi):
    """Replaying the raw outputs captured on the two-H200 machine gives what the module returned live there."""
    live = x2_live_results()[(CAPTURED_AS, "nvidia-smi", 2)]
    result = smi("h200-x2", tensor_parallel_size=2)
    for key in ("status", "driver_version", "cuda_driver_version", "gpu_count", "gpus", "links", "nvswitch", "plan"):
        assert result[key] == live[key], key


class _FakeDockerHost:
    """What container_pids sees of a host: docker on PATH (or not) and `docker top NAME -eo pid` per container."""

    def __init__(self, tops, docker="/usr/bin/docker"):
        self.tops, self.docker, self.calls = tops, docker, []

    def get_bin_path(self, name):
        return self.docker if name == "docker" else None

    def run_command(self, argv):
        self.calls.append(argv)
        top = self.tops.get(argv[2])
        return (0, top, "") if top is not None else (1, "", "Error: No such container: %s" % argv[2])


def test_the_containers_processes_are_read_with_docker_top():
    from ansible_collections.onprem.vllm.plugins.modules import gpu_topology_info

    host = _FakeDockerHost({"vllm": "PID\n4242\n4250\n", "vllm-embed": "PID\n"})
    assert gpu_topology_info.container_pids(host, ["vllm", "vllm-embed", "gone"]) == [4242, 4250]
    assert host.calls[0] == ["/usr/bin/docker", "top", "vllm", "-eo", "pid"]
    # No container named, or no Docker on the host: nothing read, nothing added.
    assert gpu_topology_info.container_pids(_FakeDockerHost({}), []) == []
    assert gpu_topology_info.container_pids(_FakeDockerHost({"vllm": "PID\n1\n"}, docker=None), ["vllm"]) == []
