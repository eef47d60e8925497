# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/rollout_gateway: what the rollout does at the gateways around one deployment, at every point the
deployment's step can stop (playbooks/tasks/rollout_deployment.yml reads these decisions in its block and rescue)."""
from __future__ import annotations

import itertools

import pytest

from ansible_collections.onprem.vllm.plugins.filter.rollout_gateway_step import rollout_gateway_step
from ansible_collections.onprem.vllm.plugins.module_utils.rollout_gateway import in_rotation, step

PREPARED_UNCHANGED = {"state": "prepared", "replaces": False}
PREPARED_REPLACED = {"state": "prepared", "replaces": True}
# The action plugin sets state from the call even where the module died without a result.
DEPLOY_DIED = {"state": "deployed", "failed": True, "msg": "MODULE FAILURE"}
ROLLED_BACK = {"state": "deployed", "failed": True, "outcome": "failed", "replaces": True, "rolled_back": True}
PASSED = {"state": "deployed", "outcome": "done", "replaces": True, "rolled_back": False}
DRAINED = {"drained": True}


def listing(*items):
    """rollout_host_checks.yml's registered check: (deployment, gateway, changed: out of rotation there)."""
    return {"results": [{"_onprem_listing": [{"name": name}, gateway], "changed": changed}
                        for name, gateway, changed in items]}


IN_ROTATION = listing(("chat", "gw1", False), ("chat", "gw2", False), ("embed", "gw1", True))


def decide(server, gateway=None, found=None, gpu_return=False, gateways=1):
    return step(server, gateway or {}, found, "chat", gpu_return, gateways)


@pytest.mark.parametrize(("server", "drain"), [
    ({}, False),
    (PREPARED_UNCHANGED, False),
    (PREPARED_REPLACED, True),
])
def test_only_a_replaced_server_is_drained(server, drain):
    assert decide(server)["drain"] is drain


def test_nothing_is_drained_or_undrained_without_a_gateway():
    for server, gateway in itertools.product([{}, PREPARED_REPLACED, DEPLOY_DIED, ROLLED_BACK, PASSED], [{}, DRAINED]):
        assert not any(decide(server, gateway, gateways=0).values()), (server, gateway)


# The step stopped before its deploy began: the checks or prepare failed ({} or prepared), or the drain failed midway
# (drained, prepare's result still the last): the running server was never touched, so it goes back once it passes
# the gateway's checks.
@pytest.mark.parametrize(("server", "gateway"), [
    ({}, {}),
    ({"state": "prepared", "failed": True}, {}),
    (PREPARED_REPLACED, DRAINED),
])
def test_a_step_stopped_before_its_deploy_puts_the_untouched_server_back(server, gateway):
    decision = decide(server, gateway)
    assert decision["undrain_restored"] and not decision["stays_out_cut_short"]


def test_a_failed_gate_whose_previous_server_was_restored_puts_it_back():
    decision = decide(ROLLED_BACK, DRAINED)
    assert decision["undrain_restored"] and not decision["stays_out_cut_short"]


def test_a_deploy_cut_short_after_the_drain_keeps_the_host_out():
    decision = decide(DEPLOY_DIED, DRAINED)
    assert not decision["undrain_restored"] and decision["stays_out_cut_short"]


def test_an_unchanged_server_that_fails_its_gate_is_put_back_through_the_gateways_checks():
    # Not drained by this run: the undrain's fresh health checks decide.
    decision = decide({"state": "deployed", "failed": True, "outcome": "failed", "replaces": False})
    assert decision["undrain_restored"] and not decision["stays_out_cut_short"]


def test_a_passed_gate_whose_undrain_failed_is_neither_put_back_nor_called_cut_short():
    decision = decide(PASSED, DRAINED)
    assert not decision["undrain_restored"] and not decision["stays_out_cut_short"]


def test_a_returning_host_that_fails_stays_out():
    for server, gateway in itertools.product([{}, PREPARED_REPLACED, ROLLED_BACK], [{}, DRAINED]):
        assert not decide(server, gateway, gpu_return=True)["undrain_restored"], (server, gateway)


@pytest.mark.parametrize(("found", "gateway", "gpu_return", "undrain"), [
    (IN_ROTATION, {}, False, False),  # in rotation everywhere, not drained by this run: nothing to put back
    (listing(("chat", "gw1", False), ("chat", "gw2", True)), {}, False, True),  # out at one gateway
    (IN_ROTATION, DRAINED, False, True),  # this run drained it
    (IN_ROTATION, {}, True, True),  # a returning host's servers were drained by the run
    (None, {}, False, True),  # the check did not run: not known
    ({"skipped": True}, {}, False, True),
])
def test_a_passed_gate_undrains_unless_the_server_is_known_in_rotation(found, gateway, gpu_return, undrain):
    assert decide(PASSED, gateway, found, gpu_return)["undrain"] is undrain
    assert in_rotation(found, "chat", bool(gateway), gpu_return) is not undrain


def test_no_step_puts_back_a_server_that_never_passed_a_gate():
    """Every point the step can stop at: a drained host whose new server was started and not restored stays out."""
    servers = [{}, PREPARED_UNCHANGED, PREPARED_REPLACED, DEPLOY_DIED, ROLLED_BACK, PASSED,
               {"state": "deployed", "outcome": "failed", "rolled_back": False, "failed": True}]
    for server, gateway, gpu_return, found in itertools.product(servers, [{}, DRAINED], [False, True], [None, IN_ROTATION]):
        decision = decide(server, gateway, found, gpu_return)
        assert not (decision["undrain_restored"] and decision["stays_out_cut_short"])
        ungated_in_place = (server.get("state") == "deployed" and server.get("outcome") != "done"
                            and not server.get("rolled_back") and gateway)
        if ungated_in_place:
            assert not decision["undrain_restored"] and decision["stays_out_cut_short"], (server, gateway, gpu_return)


def test_the_filter_takes_jinja_values():
    assert rollout_gateway_step(PREPARED_REPLACED, {}, None, "chat", False, 2)["drain"] is True
    assert rollout_gateway_step(DEPLOY_DIED, DRAINED, None, "chat", "false", "1")["stays_out_cut_short"] is True
    assert rollout_gateway_step(ROLLED_BACK, DRAINED, None, "chat", "false", 1)["undrain_restored"] is True
    assert rollout_gateway_step(None, None, None, "chat", False, 0) == {
        "drain": False, "undrain": False, "undrain_restored": False, "stays_out_cut_short": False}
