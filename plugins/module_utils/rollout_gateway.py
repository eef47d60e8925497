# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the rollout does at the gateways around one deployment of one host (playbooks/tasks/rollout_deployment.yml).

Pure: given what the deployment's step has done so far (vllm_server_result: prepare's, then deploy's; gateway_result
of the drain), what the run's checks found at the gateways (rollout_host_checks.yml's listing) and whether the host
is returning after a GPU fault, it says whether to drain, whether to undrain after a passed gate, and, once the step
failed, whether the restored server goes back in rotation or the host stays out. The rule that matters: a server is
put back only where it passed a gate (the new one), was never replaced, or was restored to the one that passed the
last gate; a deployment cut short after its drain (its previous server not restored) stays out until a re-run gates
it.
"""
from __future__ import annotations


def in_rotation(listing, deployment: str, drained: bool, gpu_return: bool) -> bool:
    """Whether the deployment's server is in rotation at every gateway without this run having drained it.

    listing is the registered result of rollout_host_checks.yml's read-only check (one item per deployment and gateway,
    changed where the server is out of rotation there); None where that check did not run, which counts as not known
    (the undrain runs).
    """
    if listing is None or "results" not in listing or drained or gpu_return:
        return False
    return not any(
        item.get("changed") for item in listing["results"]
        if (item.get("_onprem_listing") or [{}])[0].get("name") == deployment
    )


def step(server: dict, gateway: dict, listing, deployment: str, gpu_return: bool, gateways: int) -> dict:
    """The gateway's part of the deployment's step, from what happened so far (see the module's docstring).

    server: vllm_server_result so far ({} before prepare returned): state (prepared, deployed), outcome (done: the
    gate passed), replaces, rolled_back. gateway: gateway_result so far ({} before a drain): drained (set before the
    drain acts, so true also where it failed midway).
    """
    server = server or {}
    drained = bool((gateway or {}).get("drained"))
    started = server.get("state") == "deployed"
    passed = started and server.get("outcome") == "done"
    rolled_back = bool(server.get("rolled_back"))
    failed_behind_gateways = gateways > 0 and not passed
    return {
        "drain": gateways > 0 and bool(server.get("replaces")),
        "undrain": gateways > 0 and not in_rotation(listing, deployment, drained, gpu_return),
        # Failed: back in rotation where nothing was replaced yet, the previous server was restored, or nothing was
        # drained (the undrain checks it first). A returning host stays out: its fault flag is back.
        "undrain_restored": failed_behind_gateways and not gpu_return and (not started or rolled_back or not drained),
        "stays_out_cut_short": failed_behind_gateways and started and drained and not rolled_back,
    }
