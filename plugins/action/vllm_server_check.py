# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm.vllm_server_check: vllm_server's checks before the running server is touched, in one task. Reads the
host once with vllm_host_info (the server's containers, the port, the deployment's records, the pinned snapshot),
then names every refusal at once on the controller (module_utils/vllm_server_checks.py). Documentation:
plugins/modules/vllm_server_check.py."""
from __future__ import annotations

from ansible.errors import AnsibleError

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_server_checks
from ansible_collections.onprem.vllm.plugins.plugin_utils.read_only_action import ReadOnlyAction


class ActionModule(ReadOnlyAction):
    ARGUMENT_SPEC = dict(
        host_name=dict(type="str", required=True),
        container_name=dict(type="str", required=True),
        config_dir=dict(type="str", required=True),
        settings=dict(type="dict", required=True),
        api_key=dict(type="raw", no_log=True, default=""),
        api_key_rotation=dict(type="raw", no_log=True, default=""),
        bind_address=dict(type="str", default="127.0.0.1"),
        port=dict(type="int", required=True),
        cpu_mode=dict(type="bool", default=False),
        gpu_count=dict(type="int", default=1),
        gpu_uuids=dict(type="list", elements="str", default=[]),
        model=dict(type="str", default=""),
        model_revision=dict(type="str", default=""),
        hf_cache_path=dict(type="str", default=""),
        snapshot_config=dict(type="str", default=""),
        tls_clients=dict(type="str", default=""),
        extra_args=dict(type="list", elements="raw", default=[]),
        env=dict(type="dict", default={}),
        server_args_variable=dict(type="str", default=""),
    )

    def decide(self, result, params, task_vars):
        loopback = params["bind_address"] in vllm_server_checks.LOOPBACK_ADDRESSES
        host = self._execute_module(
            module_name="onprem.vllm.vllm_host_info", task_vars=task_vars,
            module_args=dict(container_names=[params["container_name"], params["container_name"] + "-previous"],
                             port=params["port"], port_host="127.0.0.1" if loopback else params["bind_address"],
                             deployment_records=dict(config_dir=params["config_dir"], name=params["container_name"]),
                             paths=[params["snapshot_config"]] if params["snapshot_config"] else []))
        if host.get("failed"):
            result.update(failed=True, msg=host.get("msg", "onprem.vllm.vllm_host_info failed"))
            return result
        errors = vllm_server_checks.refusals(params, host)
        if not errors and params["server_args_variable"]:
            errors = self._render_server_args(params["server_args_variable"])
        result.update(failed=bool(errors), refusals=errors,
                      msg=("vllm_server on %s refused before anything changed: %s"
                           % (params["host_name"], " ".join(errors))) if errors else "All checks passed",
                      port_listening=host.get("port_listening", False))
        return result

    def _render_server_args(self, variable):
        """The refusal of the server's arguments (empty, or a setting the pinned vLLM refuses), rendered last: a bad
        setting above would only fail them again with a vaguer message."""
        try:
            rendered = self._templar.resolve_variable_expression(variable)
        except AnsibleError as exc:
            return [exc.message]
        return [] if rendered else ["%s rendered no server arguments." % variable]
