# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm.gpu_preflight: one task for a deployment's GPU preflight. Reads the host with gpu_health_info and
gpu_topology_info (two round trips), then decides on the controller (module_utils/gpu_preflight_verdict.py): every
refusal at once, the warnings, the GPUs chosen. Documentation: plugins/modules/gpu_preflight.py."""
from __future__ import annotations

from ansible_collections.onprem.vllm.plugins.module_utils import gpu_preflight_verdict
from ansible_collections.onprem.vllm.plugins.plugin_utils.read_only_action import ReadOnlyAction


def _given(params, *names):
    """The module arguments among names that are set (an empty string or list leaves the module's default)."""
    return {name: params[name] for name in names if params[name] not in ("", [], None)}


class ActionModule(ReadOnlyAction):
    ARGUMENT_SPEC = dict(
        host_name=dict(type="str", required=True),
        cpu_mode=dict(type="bool", default=False),
        tensor_parallel_size=dict(type="int", required=True),
        backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
        nvidia_smi_path=dict(type="path"),
        kernel_log_path=dict(type="path"),
        ignore_xids=dict(type="list", elements="int", default=[]),
        xids_after=dict(type="str", default=""),
        gpu_uuids=dict(type="list", elements="str", default=[]),
        exclude_gpu_uuids=dict(type="list", elements="str", default=[]),
        allowed_process_names=dict(type="list", elements="str", default=[]),
        allowed_container_names=dict(type="list", elements="str", default=[]),
        max_foreign_memory_bytes=dict(type="int", default=1073741824),
        fail_on_warnings=dict(type="bool", default=False),
        quantization=dict(type="str", default=""),
        model_dtype=dict(type="str", default="auto"),
        driver_image_check=dict(type="bool", default=True),
        image_tag=dict(type="str", default=""),
        image_cuda=dict(type="str", default=""),
    )

    def decide(self, result, params, task_vars):
        health = self._execute_module(
            module_name="onprem.vllm.gpu_health_info", task_vars=task_vars,
            module_args=dict(_given(params, "nvidia_smi_path", "kernel_log_path", "xids_after", "gpu_uuids"),
                             backend=params["backend"], ignore_xids=params["ignore_xids"]))
        if health.get("failed"):
            return self._failed(result, health)
        # In CPU mode no server holds a GPU: nothing to tell apart from foreign processes.
        topology = self._execute_module(
            module_name="onprem.vllm.gpu_topology_info", task_vars=task_vars,
            module_args=dict(_given(params, "nvidia_smi_path", "gpu_uuids"),
                             backend=params["backend"], tensor_parallel_size=params["tensor_parallel_size"],
                             exclude_gpu_uuids=params["exclude_gpu_uuids"],
                             p2p_risks=health.get("p2p_risks") or [],
                             allowed_process_names=params["allowed_process_names"],
                             allowed_container_names=[] if params["cpu_mode"] else params["allowed_container_names"]))
        if topology.get("failed"):
            return self._failed(result, topology)
        decided = gpu_preflight_verdict.verdict(params["host_name"], health, topology, params)
        result.update(failed=decided["failed"], msg=decided["msg"], choice=decided["choice"],
                      warnings_list=decided["warnings"])
        if decided["warnings"]:
            result["warnings"] = list(decided["warnings"])
        # Shown without -v, as assert's message is: the GPUs chosen and why, or CPU mode (the result is kept small).
        result["_ansible_verbose_always"] = True
        return result

    @staticmethod
    def _failed(result, module_result):
        """A module that could not read the host fails the task with its own message."""
        result.update(failed=True, msg=module_result.get("msg", "failed"))
        return result
