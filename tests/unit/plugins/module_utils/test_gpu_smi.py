# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_smi

# fixture helpers (kept in each test file: tests/unit has no packages)


FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "gpu"))
# live-2026-11-29/facts.json keys the results by the name the module ran under there (gpu_topology_info).
CAPTURED_AS = "gpu_topology"
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")
MULTI_CASES = ("dual-5090-gns", "quad-3090-nvlink-pairs", "dgx-h100-nvswitch", "two-socket-3090-sys")


def case_path(case, name=None):
    return os.path.join(FIXTURES, case, name) if name else os.path.join(FIXTURES, case)


def read(case, name):
    with open(case_path(case, name)) as handle:
        return handle.read()


def fake_runner(case):
    """run(argv) -> (rc, out, err) executing the real fake-nvidia-smi script for a case folder."""
    env = dict(os.environ, FAKE_NVIDIA_SMI_CASE=case_path(case))

    def run(argv):
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=env)
        return proc.returncode, proc.stdout, proc.stderr

    return run


# ---------- the real H200 output (tests/unit/fixtures/gpu/h200-x1, see its SOURCE.md) ----------

def test_h200_query_xml_real():
    header, gpus = gpu_smi.parse_query_xml(read("h200-x1", "nvidia-smi-q.xml"))
    assert header["driver_version"] == "580.159.04"
    assert header["cuda_driver_version"] == "13.0"
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu["uuid"] == "GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f"
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["memory_total_bytes"] == 143771 * 2**20
    assert gpu["memory_used_bytes"] == 0
    assert gpu["compute_capability"] == "9.0"
    assert gpu["compute_capability_source"] == "architecture-table"
    assert (gpu["pcie_gen"], gpu["pcie_width"]) == (5, 16)
    assert gpu["persistence_mode"] is True
    assert gpu["mig_mode"] is False
    assert gpu["processes"] == []
    assert gpu["ecc"]["mode_enabled"] is True
    assert gpu["ecc"]["volatile_uncorrected"] == 0
    assert gpu["ecc"]["remapped_rows_pending"] is False
    assert gpu["ecc"]["retired_pages_dbe"] is None  # N/A on Hopper (row remapping instead)


def test_h200_memory_matches_nvml_dump():
    """nvml.txt (same capture) gives the total in bytes; -q -x gives MiB. They must agree."""
    nvml_line = [l for l in read("h200-x1", "nvml.txt").splitlines() if l.startswith("0 NVIDIA H200")][0]
    nvml_total = int(nvml_line.split()[3])
    _header, gpus = gpu_smi.parse_query_xml(read("h200-x1", "nvidia-smi-q.xml"))
    assert gpus[0]["memory_total_bytes"] == nvml_total


def test_h200_topo_with_ansi_escapes():
    text = read("h200-x1", "topo-m.txt")
    assert "\x1b[4m" in text  # real nvidia-smi underlines the header
    topo = gpu_smi.parse_topo_matrix(text)
    assert topo["gpu_count"] == 1
    assert topo["numa"] == {0: 0}
    assert topo["cpu_affinity"] == {0: "0-15"}
    assert topo["links"] == {}


def test_h200_p2p_single_gpu():
    assert gpu_smi.parse_topo_p2p(read("h200-x1", "topo-p2p-r.txt")) == {}


def test_h200_assemble_through_fake_binary():
    facts, status, msg, warnings = gpu_smi.collect(fake_runner("h200-x1"), FAKE_SMI)
    assert status == "ok", msg
    assert warnings == []
    assert facts["gpus"][0]["numa_node"] == 0
    assert facts["links"] == {}
    assert facts["nvswitch"] == {"present": False, "evidence": []}


# ---------- live capture from this collection's own run on the H200 ----------

def test_live_capture_parses_like_the_live_modules_reported():
    """The raw -q -x/topo -m captured on the H200 must parse to the facts the modules returned there, live."""
    live = json.loads(read("h200-x1", "live-2026-11-29/facts.json"))
    header, gpus = gpu_smi.parse_query_xml(read("h200-x1", "live-2026-11-29/nvidia-smi-q.xml"))
    topo = gpu_smi.parse_topo_matrix(read("h200-x1", "live-2026-11-29/topo-m.txt"))
    for key in (CAPTURED_AS + "/nvml", CAPTURED_AS + "/nvidia-smi"):
        reported = live[key]
        assert reported["status"] == "ok"
        assert reported["driver_version"] == header["driver_version"]
        assert reported["cuda_driver_version"] == header["cuda_driver_version"]
        assert reported["gpu_count"] == len(gpus) == 1
        rgpu, pgpu = reported["gpus"][0], gpus[0]
        for field in ("uuid", "name", "pci_bus_id", "memory_total_bytes", "compute_capability", "pcie_gen",
                      "pcie_width", "pcie_gen_max", "pcie_width_max", "persistence_mode", "mig_mode"):
            assert rgpu[field] == pgpu[field], (key, field)
        # nvidia-smi rounds to MiB, NVML is exact: within 1 MiB
        assert abs(rgpu["memory_reserved_bytes"] - pgpu["memory_reserved_bytes"]) < 2**20
    assert live[CAPTURED_AS + "/nvidia-smi"]["gpus"][0]["numa_node"] == topo["numa"][0] == 0


def test_live_and_shared_capture_are_the_same_machine_kind():
    _h1, shared = gpu_smi.parse_query_xml(read("h200-x1", "nvidia-smi-q.xml"))
    _h2, live = gpu_smi.parse_query_xml(read("h200-x1", "live-2026-11-29/nvidia-smi-q.xml"))
    assert shared[0]["name"] == live[0]["name"]
    assert shared[0]["memory_total_bytes"] == live[0]["memory_total_bytes"]
    assert shared[0]["uuid"] != live[0]["uuid"]  # two different physical H200s were lent


# ---------- public multi-GPU topologies ----------

def test_dgx_h100_nvswitch_topology_with_paste_defects():
    topo = gpu_smi.parse_topo_matrix(read("dgx-h100-nvswitch", "topo-m.txt"))
    assert topo["gpu_count"] == 8
    assert len(topo["links"]) == 28
    assert set(topo["links"].values()) == {"NV18"}
    assert [topo["numa"][i] for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo["cpu_affinity"][4] == "56-111,168-223"


def test_quad_3090_space_separated_paste():
    topo = gpu_smi.parse_topo_matrix(read("quad-3090-nvlink-pairs", "topo-m.txt"))
    assert topo["links"] == {(0, 1): "PHB", (0, 2): "NV4", (0, 3): "NODE", (1, 2): "NODE", (1, 3): "NV4", (2, 3): "PHB"}


def test_two_socket_numa_na_and_sys():
    topo = gpu_smi.parse_topo_matrix(read("two-socket-3090-sys", "topo-m.txt"))
    assert topo["links"] == {(0, 1): "SYS"}
    assert topo["numa"] == {0: None, 1: 1}
    assert topo["cpu_affinity"] == {0: "0-7,16-23", 1: "8-15,24-31"}


def test_dual_5090_gns_matrix():
    assert gpu_smi.parse_topo_p2p(read("dual-5090-gns", "topo-p2p-r.txt")) == {(0, 1): "GNS"}


@pytest.mark.parametrize("case", MULTI_CASES)
def test_every_case_through_the_fake_binary(case):
    facts, status, msg, warnings = gpu_smi.collect(fake_runner(case), FAKE_SMI)
    assert status == "ok", msg
    n = len(facts["gpus"])
    assert len(facts["links"]) == n * (n - 1) // 2
    for key, link in facts["links"].items():
        i, j = map(int, key.split("-"))
        assert i < j
        assert link["type"] is not None
        assert set(link) == {"type", "nvlink_count", "p2p_read", "p2p_write", "p2p_nvlink"}
    # cases without recorded p2p matrices say so instead of inventing a status
    for cap in ("r", "w", "n"):
        if not os.path.exists(case_path(case, "topo-p2p-%s.txt" % cap)):
            assert any("topo -p2p %s" % cap in w for w in warnings)


def test_nvswitch_detection():
    dgx, _s, _m, _w = gpu_smi.collect(fake_runner("dgx-h100-nvswitch"), FAKE_SMI)
    quad, _s, _m, _w = gpu_smi.collect(fake_runner("quad-3090-nvlink-pairs"), FAKE_SMI)
    assert dgx["nvswitch"]["present"] is True
    assert quad["nvswitch"]["present"] is False


def test_compute_capability_table():
    cc = gpu_smi.compute_capability_from_name
    assert cc("Ada Lovelace", "NVIDIA GeForce RTX 4090") == "8.9"
    assert cc("Ampere", "NVIDIA GeForce RTX 3090") == "8.6"
    assert cc("Ampere", "NVIDIA A100-SXM4-80GB") == "8.0"
    assert cc("Hopper", "NVIDIA H100 80GB HBM3") == "9.0"
    assert cc("Blackwell", "NVIDIA GeForce RTX 5090") == "12.0"
    assert cc("Blackwell", "NVIDIA B200") == "10.0"
    assert cc("Unknown", "x") is None


# ---------- failures ----------

@pytest.mark.parametrize("case,status", [("driver-mismatch", "driver_library_mismatch"), ("no-driver", "no_driver")])
def test_failures_through_the_fake_binary(case, status):
    facts, got, msg, _w = gpu_smi.collect(fake_runner(case), FAKE_SMI)
    assert facts is None
    assert got == status
    assert "nvidia-smi -q -x failed" in msg


def test_classify_messages():
    assert gpu_smi.classify_smi_failure("No devices were found") == "no_gpu"
    assert gpu_smi.classify_smi_failure("Unable to determine the device handle for GPU0000:01:00.0: Unknown Error") == "gpu_lost"
    assert gpu_smi.classify_smi_failure("something else") == "error"


def test_bad_xml_is_a_clear_error():
    with pytest.raises(gpu_smi.SmiParseError, match="not valid XML"):
        gpu_smi.parse_query_xml("<nvidia_smi_log><gpu>")
    with pytest.raises(gpu_smi.SmiParseError, match="no output"):
        gpu_smi.parse_query_xml("")
    with pytest.raises(gpu_smi.SmiParseError, match="GPU0 header"):
        gpu_smi.parse_topo_matrix("nothing here")


def test_processes_and_old_ecc_layout():
    xml = """<nvidia_smi_log><driver_version>470.1</driver_version><cuda_version>11.4</cuda_version>
    <gpu id="00000000:3B:00.0"><product_name>Tesla V100-SXM2-32GB</product_name>
    <product_architecture>Volta</product_architecture><uuid>GPU-x</uuid>
    <pci><pci_bus_id>00000000:3B:00.0</pci_bus_id></pci>
    <fb_memory_usage><total>32510 MiB</total><used>2048 MiB</used></fb_memory_usage>
    <ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
    <ecc_errors><volatile><single_bit><total>4</total></single_bit><double_bit><total>2</total></double_bit></volatile></ecc_errors>
    <retired_pages><double_bit_retirement><retired_count>3</retired_count></double_bit_retirement>
    <pending_retirement>Yes</pending_retirement></retired_pages>
    <processes><process_info><pid>4242</pid><type>C</type><process_name>python3</process_name>
    <used_memory>2040 MiB</used_memory></process_info></processes></gpu></nvidia_smi_log>"""
    _h, gpus = gpu_smi.parse_query_xml(xml)
    gpu = gpus[0]
    assert gpu["compute_capability"] == "7.0"
    assert gpu["ecc"]["volatile_uncorrected"] == 2
    assert gpu["ecc"]["retired_pages_dbe"] == 3
    assert gpu["ecc"]["retired_pages_pending"] is True
    assert gpu["processes"] == [{"pid": 4242, "name": "python3", "type": "C", "used_memory_bytes": 2040 * 2**20}]


@pytest.mark.parametrize("raw,expected", [
    ("00000000:0A:00.0", "0000:0a:00.0"), ("0000:0a:00", "0000:0a:00.0"), ("PCI:0000:cb:00", "0000:cb:00.0"),
    ("0a:00.1", "0000:0a:00.1"), (None, None)])
def test_normalize_pci(raw, expected):
    assert gpu_smi.normalize_pci_bus_id(raw) == expected
