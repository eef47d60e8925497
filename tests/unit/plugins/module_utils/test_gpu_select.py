# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_select, gpu_smi

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu"))
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")


def topology(case):
    env = dict(os.environ, FAKE_NVIDIA_SMI_CASE=os.path.join(FIXTURES, case))

    def run(argv):
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=env)
        return proc.returncode, proc.stdout, proc.stderr

    facts, status, msg, _w = gpu_smi.collect(run, FAKE_SMI)
    assert status == "ok", msg
    return facts


def synthetic(n, links, numa=None, used=None, cc="8.9"):
    """A hand-written topology for rules no public fixture shows (labelled synthetic)."""
    gpus = [{"index": i, "uuid": "GPU-%d" % i, "numa_node": (numa or [0] * n)[i], "memory_total_bytes": 24 << 30,
             "memory_used_bytes": (used or [0] * n)[i], "compute_capability": cc, "processes": []} for i in range(n)]
    full = {}
    for i in range(n):
        for j in range(i + 1, n):
            link_type, p2p = links.get((i, j), ("SYS", "OK"))
            full["%d-%d" % (i, j)] = {"type": link_type, "nvlink_count": gpu_smi.nvlink_count(link_type),
                                      "p2p_read": p2p, "p2p_write": p2p, "p2p_nvlink": None}
    return {"gpus": gpus, "links": full}


# ---------- real topologies ----------

def test_quad_3090_prefers_an_nvlink_pair():
    plan = gpu_select.plan(topology("quad-3090-nvlink-pairs"), 2)
    assert plan["ok"]
    assert plan["selected_indices"] == [0, 2]
    assert "NVLink between every pair (NV4)" in plan["reasons"][0]


def test_quad_3090_pinned_to_uuids_keeps_the_pin():
    topo = topology("quad-3090-nvlink-pairs")
    uuids = [topo["gpus"][1]["uuid"], topo["gpus"][3]["uuid"]]
    plan = gpu_select.plan(topo, 2, gpu_uuids=uuids)
    assert plan["selected_uuids"] == uuids
    assert "from gpu_uuids" in plan["reasons"][0]


def test_dgx_tp4_stays_in_one_numa_node():
    plan = gpu_select.plan(topology("dgx-h100-nvswitch"), 4)
    assert plan["selected_indices"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert plan["disable_custom_all_reduce"] is False
    assert plan["nccl_env"] == {"NCCL_P2P_DISABLE": "0"}


def test_dgx_tp8_spans_both_numa_nodes_and_says_so():
    plan = gpu_select.plan(topology("dgx-h100-nvswitch"), 8)
    assert plan["selected_indices"] == list(range(8))
    assert "NUMA nodes 0,1" in plan["reasons"][0]


def test_dual_5090_gns_disables_p2p():
    plan = gpu_select.plan(topology("dual-5090-gns"), 2)
    assert plan["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert plan["disable_custom_all_reduce"] is True
    assert any("read=GNS" in r and "NCCL_P2P_DISABLE=1" in r for r in plan["reasons"])
    assert plan["gpu_memory_bytes"] == 32607 * 2**20
    assert plan["min_compute_capability"] == "12.0"


def test_two_socket_sys_reports_the_socket_crossing():
    plan = gpu_select.plan(topology("two-socket-3090-sys"), 2)
    assert "across NUMA nodes / sockets (SYS)" in plan["reasons"][0]


def test_h200_single_gpu():
    plan = gpu_select.plan(topology("h200-x1"), 1)
    assert plan["ok"] and plan["nccl_env"] == {}
    assert plan["gpu_memory_bytes"] == 143771 * 2**20


# ---------- bad input ----------

def test_tp_larger_than_gpus():
    plan = gpu_select.plan(topology("h200-x1"), 2)
    assert not plan["ok"]
    assert "tensor_parallel_size 2 needs 2 GPUs" in plan["msg"] and "NVIDIA H200" in plan["msg"]


def test_missing_uuid():
    plan = gpu_select.plan(topology("dual-5090-gns"), 2, gpu_uuids=["GPU-nope", "GPU-00000000-0000-4000-8000-000000000001"])
    assert not plan["ok"]
    assert "GPU-nope" in plan["msg"] and "not present" in plan["msg"]


@pytest.mark.parametrize("tp", [0, -1, "two", None])
def test_bad_tp_values(tp):
    plan = gpu_select.plan(topology("h200-x1"), tp)
    assert not plan["ok"] and "tensor_parallel_size" in plan["msg"]


def test_no_gpus():
    plan = gpu_select.plan({"gpus": [], "links": {}}, 1)
    assert not plan["ok"] and "0 GPU(s)" in plan["msg"]


# ---------- rules on synthetic topologies ----------

def test_never_a_broken_pair_when_a_better_one_exists():
    # 0-1 are close (PIX) but report GNS; 2-3 are far (SYS) but P2P OK: the OK pair wins.
    topo = synthetic(4, {(0, 1): ("PIX", "GNS"), (2, 3): ("SYS", "OK"), (0, 2): ("SYS", "GNS"), (0, 3): ("SYS", "GNS"),
                         (1, 2): ("SYS", "GNS"), (1, 3): ("SYS", "GNS")}, numa=[0, 0, 0, 1])
    plan = gpu_select.plan(topo, 2)
    assert plan["selected_indices"] == [2, 3]
    assert plan["nccl_env"]["NCCL_P2P_DISABLE"] == "0"


def test_pcie_switch_before_host_bridge_before_numa():
    topo = synthetic(4, {(0, 1): ("PHB", "OK"), (2, 3): ("PXB", "OK"), (0, 2): ("SYS", "OK"), (0, 3): ("SYS", "OK"),
                         (1, 2): ("SYS", "OK"), (1, 3): ("SYS", "OK")})
    assert gpu_select.plan(topo, 2)["selected_indices"] == [2, 3]


def test_fewer_numa_nodes_break_ties():
    topo = synthetic(4, {(0, 1): ("NODE", "OK"), (2, 3): ("NODE", "OK")}, numa=[0, 1, 1, 1])
    assert gpu_select.plan(topo, 2)["selected_indices"] == [2, 3]


def test_less_used_memory_breaks_ties():
    topo = synthetic(3, {(0, 1): ("PIX", "OK"), (0, 2): ("PIX", "OK"), (1, 2): ("PIX", "OK")}, used=[5 << 30, 0, 0])
    assert gpu_select.plan(topo, 2)["selected_indices"] == [1, 2]


def test_custom_all_reduce_off_for_more_than_two_pcie_gpus():
    topo = synthetic(4, {}, numa=[0, 0, 0, 0])
    plan = gpu_select.plan(topo, 4)
    assert plan["disable_custom_all_reduce"] is True
    assert any("PCIe-connected" in r for r in plan["reasons"])
    two = gpu_select.plan(topo, 2)
    assert two["disable_custom_all_reduce"] is False


def test_custom_all_reduce_off_for_world_size_3():
    topo = synthetic(3, {(0, 1): ("NV4", "OK"), (0, 2): ("NV4", "OK"), (1, 2): ("NV4", "OK")})
    plan = gpu_select.plan(topo, 3)
    assert plan["disable_custom_all_reduce"] is True
    assert any("world size 3" in r for r in plan["reasons"])


def test_p2p_risks_turn_p2p_off_on_pcie_but_not_on_nvlink():
    risk = ["PCIe ACS redirect on bridge 0000:00:01.0 above GPU 0"]
    pcie = synthetic(2, {(0, 1): ("PXB", "OK")})
    assert gpu_select.plan(pcie, 2, p2p_risks=risk)["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    nvl = synthetic(2, {(0, 1): ("NV4", "OK")})
    assert gpu_select.plan(nvl, 2, p2p_risks=risk)["nccl_env"] == {"NCCL_P2P_DISABLE": "0"}


def test_foreign_memory_excludes_allowed_processes():
    gpu = {"memory_used_bytes": 10 << 30, "processes": [
        {"name": "vllm", "used_memory_bytes": 8 << 30}, {"name": "python3", "used_memory_bytes": 2 << 30}]}
    assert gpu_select.foreign_memory_bytes(gpu) == 10 << 30
    assert gpu_select.foreign_memory_bytes(gpu, ["vllm"]) == 2 << 30


def test_foreign_memory_excludes_the_server_being_replaced_by_pid():
    gpu = {"memory_used_bytes": 10 << 30, "processes": [
        {"name": "python3", "pid": 4242, "used_memory_bytes": 8 << 30},
        {"name": "python3", "pid": 777, "used_memory_bytes": 2 << 30}]}
    assert gpu_select.foreign_memory_bytes(gpu, allowed_pids=[4242]) == 2 << 30


def test_min_compute_capability_unknown():
    topo = synthetic(2, {})
    topo["gpus"][1]["compute_capability"] = None
    assert gpu_select.min_compute_capability(topo, [0, 1]) is None
    topo["gpus"][1]["compute_capability"] = "8.6"
    assert gpu_select.min_compute_capability(topo, [0, 1]) == (8, 6)
