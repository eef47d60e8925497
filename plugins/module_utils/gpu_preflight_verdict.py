# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU preflight's verdict on what gpu_health_info and gpu_topology_info read (the gpu_preflight action): every
refusal at once, the warnings, and the GPUs chosen. Pure: no I/O."""
from __future__ import annotations

import re

from ansible_collections.onprem.vllm.plugins.module_utils import image_compat

# What a deployment in CPU mode runs on (the lab): no GPU, no NCCL setting, no GPU memory.
CPU_MODE_CHOICE = {"cpu_mode": True, "gpu_uuids": [], "nccl_env": {}, "disable_custom_all_reduce": False,
                   "gpu_memory_bytes": 0, "reasons": ["no NVIDIA GPU used: lab CPU mode"]}
# Below it vLLM runs an FP8 checkpoint as weight-only FP8 (Marlin kernels).
NATIVE_FP8_COMPUTE_CAPABILITY = (8, 9)


def _version(text):
    return tuple(int(part) for part in re.findall(r"\d+", str(text))[:2])


def health_refusal(host, health, xids_after):
    """The refusal of GPUs gpu_health_info calls blocking (an Xid, an ECC error, a driver/library mismatch), or ''."""
    if not health.get("blocking"):
        return ""
    reasons = health.get("reasons") or []
    message = "GPU health check failed on %s: %s" % (host, " | ".join(reasons))
    if xids_after and any(reason.startswith("Xid ") for reason in reasons):
        message += (". Only Xids logged after %s count (the GPU fault that took the host out, or "
                    "onprem_vllm_gpu_return_confirmed_after): these came later. Fix the GPU (reset or reboot); if the "
                    "fix itself logged them, set onprem_vllm_gpu_return_confirmed_after to the time the GPU was fixed "
                    "(ISO 8601 with its offset) and run the return again" % xids_after)
    return message


def gpu_refusals(host, health, topology, tensor_parallel_size, max_foreign_memory_bytes, fail_on_warnings):
    """Why the chosen GPU set cannot serve: no GPU, no set of that size, other processes' memory, warnings."""
    if int(topology.get("gpu_count") or 0) == 0:
        return ["No NVIDIA GPU on %s (%s: %s). Install the NVIDIA driver, or plan onprem_vllm_cpu_mode: true if this "
                "host serves on the CPU (the lab)." % (host, topology.get("status"), topology.get("msg"))]
    plan = topology.get("plan") or {}
    refusals = []
    if not plan.get("ok"):
        refusals.append("Cannot place tensor_parallel_size=%s on %s: %s" % (tensor_parallel_size, host, plan.get("msg")))
    foreign = [(uuid, used) for uuid, used in (plan.get("foreign_memory_bytes") or {}).items()
               if used > max_foreign_memory_bytes]
    if foreign:
        refusals.append("Other processes already use GPU memory on %s: %s (limit %d bytes, see nvidia-smi); stop them, "
                        "list them in gpu_preflight_allowed_process_names, or raise "
                        "gpu_preflight_max_foreign_memory_bytes."
                        % (host, ", ".join("%s holds %s" % pair for pair in foreign), max_foreign_memory_bytes))
    if fail_on_warnings and health.get("warnings_list"):
        refusals.append("GPU health warnings on %s (gpu_preflight_fail_on_warnings): %s"
                        % (host, " | ".join(health["warnings_list"])))
    return refusals


def fp8_warning(quantization, model_dtype, min_compute_capability):
    """The warning for FP8 on GPUs without native FP8, or ''."""
    wants_fp8 = "fp8" in str(quantization or "").lower() or "fp8" in str(model_dtype or "").lower()
    if not wants_fp8 or min_compute_capability is None:
        return ""
    if _version(min_compute_capability) >= NATIVE_FP8_COMPUTE_CAPABILITY:
        return ""
    return ("FP8 requested (%s/%s) but the chosen GPUs have compute capability %s (< 8.9): vLLM runs FP8 checkpoints "
            "as weight-only FP8 through the Marlin kernels there - it works, but slower than native FP8."
            % (quantization, model_dtype, min_compute_capability))


def verdict(host, health, topology, settings):
    """The preflight's verdict: {failed, msg, choice, warnings}.

    settings: cpu_mode, tensor_parallel_size, max_foreign_memory_bytes, fail_on_warnings, xids_after, quantization,
    model_dtype, driver_image_check, image_tag, image_cuda. A health refusal comes first (CPU mode too: a driver/library
    mismatch breaks the lab's GPU-less host as well), then the GPU set's, then the driver against the image's CUDA."""
    refusal = health_refusal(host, health, settings.get("xids_after"))
    if refusal:
        return {"failed": True, "msg": refusal, "choice": {}, "warnings": []}
    if settings["cpu_mode"]:
        found = int(topology.get("gpu_count") or 0)
        said = ("no NVIDIA GPU (lab CPU mode)" if found == 0
                else "the plan says CPU mode: ignoring the %d GPU(s) found (lab CPU mode)" % found)
        return {"failed": False, "msg": "%s - %s" % (said, topology.get("msg")), "choice": dict(CPU_MODE_CHOICE),
                "warnings": []}
    refusals = gpu_refusals(host, health, topology, settings["tensor_parallel_size"],
                            int(settings["max_foreign_memory_bytes"]), settings["fail_on_warnings"])
    if refusals:
        return {"failed": True, "msg": " ".join(refusals), "choice": {}, "warnings": []}
    plan = topology["plan"]
    warnings = [w for w in [fp8_warning(settings.get("quantization"), settings.get("model_dtype"),
                                        plan.get("min_compute_capability"))] if w]
    warnings += list(health.get("warnings_list") or []) + list(topology.get("warnings_list") or [])
    driver = topology.get("driver_version") or ""
    if settings.get("driver_image_check") and driver:
        compat = image_compat.check(settings["image_tag"], settings.get("image_cuda") or "", "", driver)
        if compat["errors"]:
            return {"failed": True, "msg": "; ".join(compat["errors"]), "choice": {}, "warnings": warnings}
    choice = {"cpu_mode": False, "gpu_uuids": plan["selected_uuids"], "nccl_env": plan["nccl_env"],
              "disable_custom_all_reduce": plan["disable_custom_all_reduce"],
              "gpu_memory_bytes": int(plan["gpu_memory_bytes"]), "reasons": plan["reasons"]}
    return {"failed": False, "msg": " | ".join(plan["reasons"]), "choice": choice, "warnings": warnings}
