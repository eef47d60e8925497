# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVML collector against a stub pynvml (no GPU here). The stub's numbers for GPU 0 are the REAL values NVML
returned on the H200 (tests/unit/fixtures/gpu/h200-x1/nvml.txt and live-2026-11-29/facts.json); the second GPU and
its NVLink are synthetic, to exercise the link code."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_nvml, gpu_smi

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu"))
# live-2026-11-29/facts.json keys the results by the name the module ran under there (gpu_topology_info).
CAPTURED_AS = "gpu_topology"


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__("NVML error %d" % value)
        self.value = value


def make_stub(gpus, nvlinks=None, init_error=None, p2p=0):
    nvlinks = nvlinks or {}

    def not_supported(*_a, **_k):
        raise NVMLError(3)

    def init():
        if init_error:
            raise NVMLError(init_error)

    stub = SimpleNamespace(
        nvmlMemory_v2=33554472,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 13000,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=gpus[h]["bus"].encode()),
        nvmlDeviceGetMemoryInfo=lambda h, version=None: SimpleNamespace(total=gpus[h]["total"], used=0, reserved=644939776),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetPersistenceMode=lambda h: 1,
        nvmlDeviceGetMigMode=lambda h: (0, 0),
        nvmlDeviceGetGpuFabricInfo=not_supported,
        nvmlDeviceGetUUID=lambda h: gpus[h]["uuid"],
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetNumaNodeId=not_supported,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=2 << 30)] if h == 1 else [],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlSystemGetProcessName=lambda pid: b"/usr/bin/python3",
        nvmlDeviceGetEccMode=lambda h: (1, 1),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 0,
        nvmlDeviceGetRetiredPages=not_supported,
        nvmlDeviceGetRetiredPagesPendingStatus=not_supported,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetNvLinkState=lambda h, link: nvlinks[h][link][0] if link < len(nvlinks.get(h, [])) else not_supported(),
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(busId=nvlinks[h][link][1].encode()),
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: nvlinks[h][link][2],
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
        nvmlDeviceGetP2PStatus=lambda a, b, idx: p2p,
    )
    return stub


H200 = {"bus": "00000000:00:06.0", "total": 150754820096, "uuid": "GPU-5c942d57-d31d-83af-4731-0fced0ecea57"}


@pytest.fixture
def stub(monkeypatch):
    def install(*args, **kwargs):
        fake = make_stub(*args, **kwargs)
        monkeypatch.setattr(gpu_nvml, "pynvml", fake)
        monkeypatch.setattr(gpu_nvml, "HAS_PYNVML", True)
        return fake
    return install


def test_single_h200_matches_live_nvml_facts(stub, tmp_path):
    stub([H200])
    (tmp_path / "sys/bus/pci/devices/0000:00:06.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices/0000:00:06.0/numa_node").write_text("-1\n")  # as read on the H200
    (tmp_path / "sys/devices/system/node/node0").mkdir(parents=True)
    facts, status, _msg, _w = gpu_nvml.collect(str(tmp_path))
    assert status == "ok"
    with open(os.path.join(FIXTURES, "h200-x1", "live-2026-11-29", "facts.json")) as handle:
        live = json.load(handle)[CAPTURED_AS + "/nvml"]
    got, want = facts["gpus"][0], live["gpus"][0]
    for key in want:
        if key != "numa_node":
            assert got[key] == want[key], key
    assert got["numa_node"] == 0  # single NUMA node: same answer nvidia-smi topo -m gives
    assert facts["driver_version"] == live["driver_version"] and facts["cuda_driver_version"] == live["cuda_driver_version"]


def test_same_shape_as_the_smi_parser(stub, tmp_path):
    stub([H200])
    facts, _s, _m, _w = gpu_nvml.collect(str(tmp_path))
    smi_facts, _w2 = gpu_smi.assemble(open(os.path.join(FIXTURES, "h200-x1", "nvidia-smi-q.xml")).read())
    assert set(facts) == set(smi_facts)
    assert set(facts["gpus"][0]) == set(smi_facts["gpus"][0]) | {"cpu_affinity"} - set()
    assert set(facts["gpus"][0]["ecc"]) == set(smi_facts["gpus"][0]["ecc"])


def test_nvlink_pair_and_switch(stub, tmp_path):
    second = {"bus": "00000000:00:07.0", "total": 150754820096, "uuid": "GPU-synthetic-2"}
    # synthetic: GPU0 and GPU1 joined by 4 direct links
    stub([H200, second], nvlinks={0: [(1, "00000000:00:07.0", 0)] * 4, 1: [(1, "00000000:00:06.0", 0)] * 4})
    facts, _s, _m, _w = gpu_nvml.collect(str(tmp_path))
    assert facts["links"]["0-1"] == {"type": "NV4", "nvlink_count": 4, "p2p_read": "OK", "p2p_write": "OK", "p2p_nvlink": "OK"}
    assert facts["gpus"][1]["processes"] == [{"pid": 4242, "name": "python3", "type": "C", "used_memory_bytes": 2 << 30}]
    assert facts["nvswitch"]["present"] is False
    stub([H200, second], nvlinks={0: [(1, "00000000:ff:00.0", 2)] * 18, 1: [(1, "00000000:fe:00.0", 2)] * 18})
    facts, _s, _m, _w = gpu_nvml.collect(str(tmp_path))
    assert facts["links"]["0-1"]["type"] == "NV18"
    assert facts["nvswitch"]["present"] is True


def test_pcie_pair_maps_topology_and_p2p(stub, tmp_path):
    second = {"bus": "00000000:00:07.0", "total": 1, "uuid": "GPU-synthetic-2"}
    stub([H200, second], p2p=2)  # GPU_NOT_SUPPORTED
    facts, _s, _m, _w = gpu_nvml.collect(str(tmp_path))
    assert facts["links"]["0-1"]["type"] == "PHB"
    assert facts["links"]["0-1"]["p2p_read"] == "GNS"


@pytest.mark.parametrize("code,status", [(18, "driver_library_mismatch"), (9, "no_driver"), (12, "no_driver"), (15, "gpu_lost"), (999, "error")])
def test_init_errors(stub, code, status):
    stub([H200], init_error=code)
    facts, got, msg, _w = gpu_nvml.collect("/")
    assert facts is None and got == status and msg


def test_missing_pynvml(monkeypatch):
    monkeypatch.setattr(gpu_nvml, "HAS_PYNVML", False)
    monkeypatch.setattr(gpu_nvml, "PYNVML_IMPORT_ERROR", "nvidia-ml-py (module pynvml) is not importable on the target: x")
    facts, status, msg, _w = gpu_nvml.collect("/")
    assert facts is None and status == "no_nvml" and "nvidia-ml-py" in msg
    # auto falls back to nvidia-smi; with none found it says both are missing
    result = gpu_nvml.collect_topology("auto", None, None)
    assert result["status"] == "no_driver" and "nvidia-ml-py is not importable" in result["msg"]
