# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm.kv_preflight: the KV step of a deployment's preflight in one task. Plans on the controller from the
model's facts or a config.json there (no round trip), or runs onprem.vllm.kv_headroom on the host where the config
is only there; the verdict (module_utils/kv_request.py) fails the task with the fix or says what the plan gives.
Documentation: plugins/modules/kv_preflight.py."""
from __future__ import annotations

import os

from ansible_collections.onprem.vllm.plugins.module_utils import kv_request
from ansible_collections.onprem.vllm.plugins.plugin_utils.read_only_action import ReadOnlyAction

# What the kv_headroom module's own result adds to the plan's facts.
_MODULE_KEYS = ("changed", "failed", "invocation", "msg", "warnings", "deprecations")


def missing_config_message(path, where):
    return ("The KV-cache check needs the planned model's config.json, and %s does not exist on %s (a host that has "
            "not staged the model yet has none). Point gpu_preflight_model_config_path at a copy on the control node "
            "and set gpu_preflight_model_config_on_controller: true (e.g. `hf download MODEL config.json`), or set "
            "gpu_preflight_kv_check: false to skip the check." % (path, where))


class ActionModule(ReadOnlyAction):
    ARGUMENT_SPEC = dict(
        kv_request.ARGUMENT_SPEC,
        host_name=dict(type="str", required=True),
        deployment_name=dict(type="str", default=""),
        skipped_because=dict(type="str", default=""),
        model_config_on_controller=dict(type="bool", default=False),
    )
    MUTUALLY_EXCLUSIVE = [("model_config_path", "model_config")]

    def decide(self, result, params, task_vars):
        if params["skipped_because"]:
            # Shown without -v: a check that did not run says so. What a plan gives is shown with -v (the plan's
            # facts would fill the screen on every run).
            result.update(msg="KV-cache check skipped on %s: %s" % (params["host_name"], params["skipped_because"]),
                          kv_plan={}, _ansible_verbose_always=True)
            return result
        if not params["model_config_path"] and not params["model_config"]:
            result.update(failed=True, msg="one of model_config_path or model_config is needed, or skipped_because")
            return result
        on_host = bool(params["model_config_path"]) and not params["model_config_on_controller"]
        facts = self._plan_on_host(params, task_vars) if on_host else self._plan_here(params)
        if "msg" in facts:
            result.update(failed=True, msg=facts["msg"])
            return result
        failed, message = kv_request.preflight_verdict(params["host_name"], params["deployment_name"],
                                                       params["device"], facts)
        result.update(failed=failed, msg=message, kv_plan=facts)
        return result

    @staticmethod
    def _plan_here(params):
        """The plan computed on the controller; {"msg": why} where it cannot be."""
        path = params["model_config_path"]
        if path and not os.path.exists(path):
            return {"msg": missing_config_message(path, "the control node")}
        request = {name: params[name] for name in kv_request.ARGUMENT_SPEC}
        try:
            return kv_request.result_facts(kv_request.plan(kv_request.build_request(request)))
        except (kv_request.PlanInputError, kv_request.ModelConfigError) as exc:
            return {"msg": str(exc)}

    def _plan_on_host(self, params, task_vars):
        """The plan kv_headroom computes on the host, from the config.json there; {"msg": why} where it cannot."""
        path = params["model_config_path"]
        found = self._execute_module(module_name="ansible.builtin.stat", task_vars=task_vars,
                                     module_args=dict(path=path, get_checksum=False, get_mime=False,
                                                      get_attributes=False))
        if found.get("failed"):
            return {"msg": found.get("msg", "could not look for %s" % path)}
        if not found["stat"]["exists"]:
            return {"msg": missing_config_message(path, params["host_name"])}
        args = {name: params[name] for name in kv_request.ARGUMENT_SPEC if params[name] is not None}
        planned = self._execute_module(module_name="onprem.vllm.kv_headroom", task_vars=task_vars,
                                       module_args=dict(args, fail_on_misfit=False))
        if planned.get("failed"):
            return {"msg": planned.get("msg", "onprem.vllm.kv_headroom failed")}
        return {name: value for name, value in planned.items()
                if name not in _MODULE_KEYS and not name.startswith("_ansible")}
