# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU preflight's verdict (module_utils/gpu_preflight_verdict.py) on recorded-shape module results: each refusal,
their order, the warnings and the choice. tests/unit/roles/test_gpu_preflight.py runs the same through the role on
replayed nvidia-smi outputs."""
from __future__ import annotations

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_preflight_verdict as verdict_mod

HEALTHY = {"blocking": False, "reasons": [], "warnings_list": [], "msg": "GPU health OK", "p2p_risks": []}
PLAN = {"ok": True, "msg": "", "selected_uuids": ["GPU-a", "GPU-b"], "nccl_env": {"NCCL_P2P_DISABLE": "0"},
        "disable_custom_all_reduce": False, "gpu_memory_bytes": 25769803776, "reasons": ["NVLink pair", "free"],
        "foreign_memory_bytes": {}, "min_compute_capability": "9.0"}
TOPOLOGY = {"gpu_count": 2, "status": "ok", "msg": "2 GPUs", "warnings_list": [], "driver_version": "",
            "plan": PLAN}
SETTINGS = {"cpu_mode": False, "tensor_parallel_size": 2, "max_foreign_memory_bytes": 1 << 30,
            "fail_on_warnings": False, "xids_after": "", "quantization": "", "model_dtype": "auto",
            "driver_image_check": True, "image_tag": "v0.32.0", "image_cuda": ""}


def decide(health=None, topology=None, plan=None, **settings):
    topology = dict(topology or TOPOLOGY)
    if plan is not None:
        topology["plan"] = dict(PLAN, **plan)
    return verdict_mod.verdict("ws1", dict(HEALTHY, **(health or {})), topology, dict(SETTINGS, **settings))


def test_a_healthy_pair_is_chosen_with_its_reasons():
    decided = decide()
    assert not decided["failed"] and decided["warnings"] == []
    assert decided["choice"] == {"cpu_mode": False, "gpu_uuids": ["GPU-a", "GPU-b"],
                                 "nccl_env": {"NCCL_P2P_DISABLE": "0"}, "disable_custom_all_reduce": False,
                                 "gpu_memory_bytes": 25769803776, "reasons": ["NVLink pair", "free"]}
    assert decided["msg"] == "NVLink pair | free"


def test_cpu_mode_chooses_nothing_and_says_what_it_ignored():
    decided = decide(cpu_mode=True, topology={"gpu_count": 0, "status": "no-driver", "msg": "no nvidia-smi"})
    assert not decided["failed"] and decided["choice"] == verdict_mod.CPU_MODE_CHOICE
    assert decided["msg"] == "no NVIDIA GPU (lab CPU mode) - no nvidia-smi"
    decided = decide(cpu_mode=True)
    assert decided["msg"] == "the plan says CPU mode: ignoring the 2 GPU(s) found (lab CPU mode) - 2 GPUs"


def test_a_blocking_health_finding_refuses_first_in_cpu_mode_too():
    health = {"blocking": True, "reasons": ["Driver/library version mismatch"]}
    for cpu_mode in (False, True):
        decided = decide(health=health, cpu_mode=cpu_mode, plan={"ok": False, "msg": "no set"})
        assert decided["failed"] and decided["msg"] == "GPU health check failed on ws1: Driver/library version mismatch"


def test_an_xid_after_a_return_says_how_to_confirm_the_fix():
    health = {"blocking": True, "reasons": ["Xid 79 on GPU 0000:02:00.0 (fell off the bus)", "ECC"]}
    decided = decide(health=health, xids_after="2026-12-05T09:30:00+00:00")
    assert decided["msg"].startswith("GPU health check failed on ws1: Xid 79 on GPU 0000:02:00.0 (fell off the bus) | ECC"
                                     ". Only Xids logged after 2026-12-05T09:30:00+00:00 count")
    assert "set onprem_vllm_gpu_return_confirmed_after" in decided["msg"]
    # Without a return, or without an Xid among the reasons, no such advice.
    assert "Only Xids" not in decide(health=health)["msg"]
    assert "Only Xids" not in decide(health={"blocking": True, "reasons": ["ECC"]}, xids_after="x")["msg"]


def test_no_gpu_in_gpu_mode_names_the_cpu_mode_setting_alone():
    decided = decide(topology={"gpu_count": 0, "status": "no-driver", "msg": "no nvidia-smi"},
                     fail_on_warnings=True, health={"warnings_list": ["w"]})
    assert decided["failed"]
    assert decided["msg"] == ("No NVIDIA GPU on ws1 (no-driver: no nvidia-smi). Install the NVIDIA driver, or plan "
                              "onprem_vllm_cpu_mode: true if this host serves on the CPU (the lab).")


def test_every_gpu_refusal_at_once():
    decided = decide(plan={"ok": False, "msg": "tensor_parallel_size 2 needs 2 GPUs",
                           "foreign_memory_bytes": {"GPU-a": 2 << 30, "GPU-b": 1 << 20}},
                     health={"warnings_list": ["PCIe link degraded"]}, fail_on_warnings=True)
    assert decided["failed"]
    assert decided["msg"] == (
        "Cannot place tensor_parallel_size=2 on ws1: tensor_parallel_size 2 needs 2 GPUs "
        "Other processes already use GPU memory on ws1: GPU-a holds 2147483648 (limit 1073741824 bytes, see "
        "nvidia-smi); stop them, list them in gpu_preflight_allowed_process_names, or raise "
        "gpu_preflight_max_foreign_memory_bytes. "
        "GPU health warnings on ws1 (gpu_preflight_fail_on_warnings): PCIe link degraded")


def test_memory_up_to_the_limit_and_warnings_without_fail_on_warnings_pass():
    decided = decide(plan={"foreign_memory_bytes": {"GPU-a": 1 << 30}},
                     health={"warnings_list": ["PCIe link degraded"]}, topology=dict(TOPOLOGY, warnings_list=["nvswitch?"]))
    assert not decided["failed"] and decided["warnings"] == ["PCIe link degraded", "nvswitch?"]


def test_fp8_warns_below_compute_capability_8_9_only():
    warned = decide(plan={"min_compute_capability": "8.6"}, quantization="fp8")["warnings"]
    assert len(warned) == 1 and warned[0].startswith("FP8 requested (fp8/auto) but the chosen GPUs have compute "
                                                     "capability 8.6 (< 8.9)")
    assert decide(plan={"min_compute_capability": "8.6"}, model_dtype="float8_e4m3fn_FP8")["warnings"]
    assert decide(plan={"min_compute_capability": "8.9"}, quantization="fp8")["warnings"] == []
    assert decide(plan={"min_compute_capability": "12.0"}, quantization="fp8")["warnings"] == []
    assert decide(plan={"min_compute_capability": None}, quantization="fp8")["warnings"] == []
    assert decide(plan={"min_compute_capability": "8.6"})["warnings"] == []


def test_the_loaded_driver_must_run_the_images_cuda():
    # vLLM 0.32.0 is built for CUDA 13.0, which needs R580 (module_utils/image_compat.py).
    decided = decide(topology=dict(TOPOLOGY, driver_version="550.163.01"))
    assert decided["failed"] and "580" in decided["msg"]
    assert not decide(topology=dict(TOPOLOGY, driver_version="580.95.05"))["failed"]
    assert not decide(topology=dict(TOPOLOGY, driver_version="550.163.01"), driver_image_check=False)["failed"]
    # A GPU refusal comes before the driver's.
    decided = decide(topology=dict(TOPOLOGY, driver_version="550.163.01", plan=dict(PLAN, ok=False, msg="no set")))
    assert decided["msg"].startswith("Cannot place")
