# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm.vllm_deployment: runs the module of the same name on the host and says in one line what it did
(module_utils/deployment_engine.said; shown with -v), with a warning where differing known answers were let pass.
The module's result is the server's (what it runs, where it answers, the gates' outcomes), so the role registers it
as vllm_server_result, failed or not. Documentation: plugins/modules/vllm_deployment.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_engine


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        try:
            result.update(self._execute_module(module_name="onprem.vllm.vllm_deployment",
                                               module_args=self._task.args, task_vars=task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        # A module that died without a result still says which call failed: the rollout's rescue reads it.
        result.setdefault("state", self._task.args.get("state", "deployed"))
        if not result.get("failed"):
            host, name = self._task.args.get("host_name") or task_vars["inventory_hostname"], self._task.args["name"]
            # Shown with -v, with the gates' outcomes (the whole result would fill the screen on every change).
            result["msg"] = deployment_engine.said(host, name, result)
            warning = deployment_engine.differing_answers_warning(host, name, result)
            if warning:
                result["warnings"] = list(result.get("warnings") or []) + [warning]
        return result
