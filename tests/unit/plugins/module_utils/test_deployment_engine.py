# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment engine's decisions, run against a simulated host: every replacement, rollback and first deployment
cut after each of its actions, by a kill (the state as it is) and by a power cut (every container stopped, or the
running ones restarted by their restart policy, and with the last action's write lost), then run again. Each cut is a
case of its own. The next run must converge (the desired server runs and passed its gate, no marker, nothing set
aside, the records name it and what it replaced) or, where the new deployment fails its gate, end in FAIL with the
server that ran before running again and the records untouched; and no run may ever remove the container that last
passed a gate before its successor passed one."""
from __future__ import annotations

import copy
import itertools

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_engine as engine

NAME = "vllm"
ASIDE = "vllm-previous"


def record(deployment):
    return {"image": "vllm/vllm-openai:" + deployment, "deployment": deployment}


class Violation(AssertionError):
    pass


class Host:
    """What a host holds of one server, and the history of which container passed a gate (by a unique id)."""

    _uids = itertools.count(1)

    def __init__(self, deployment=None):
        self.containers = {}
        self.marker = None
        self.record = None
        self.previous = None
        self.passed = []
        if deployment:
            uid = next(self._uids)
            self.containers[NAME] = {"uid": uid, "deployment": deployment, "running": True}
            self.record = record(deployment)
            self.passed.append(uid)

    def observe(self):
        def box(name):
            found = self.containers.get(name)
            return engine.Container(found["deployment"], found["running"]) if found else None
        return box(NAME), box(ASIDE), copy.deepcopy(self.marker), copy.deepcopy(self.record)

    def _remove(self, name):
        uid = self.containers[name]["uid"]
        if self.passed and self.passed[-1] == uid:
            raise Violation(f"removed {name} (container {uid}), the last that passed a gate")
        del self.containers[name]

    def apply(self, action, desired, gates, good):
        """Do ACTION as the module would (each action idempotent on what it finds)."""
        a = action.name
        if a == engine.START:
            self.containers[NAME]["running"] = True
        elif a == engine.GATE:
            box = self.containers[NAME]
            passed = box["running"] and box["deployment"] in good
            gates[box["deployment"]] = passed
            if passed:
                self.passed.append(box["uid"])
        elif a == engine.RECORD:
            self.record = record(desired)
        elif a == engine.FINISH_RECORDS:
            if self.marker["replaced"] is not None:
                self.previous = self.marker["replaced"]
            self.record = self.marker["new"]
        elif a == engine.REMOVE_ASIDE:
            self._remove(ASIDE)
        elif a == engine.REMOVE_CURRENT:
            self._remove(NAME)
        elif a == engine.RESTORE_ASIDE:
            self.containers[NAME] = self.containers.pop(ASIDE)
        elif a == engine.REMOVE_MARKER:
            self.marker = None
        elif a == engine.WRITE_MARKER:
            self.marker = {"deployment": desired, "new": record(desired), "replaced": self.record}
        elif a == engine.STOP_CURRENT:
            self.containers[NAME]["running"] = False
        elif a == engine.SET_ASIDE:
            self.containers[ASIDE] = self.containers.pop(NAME)
        elif a == engine.CREATE:
            self.containers[NAME] = {"uid": next(self._uids), "deployment": desired, "running": True}
        else:
            raise AssertionError(f"unknown action {a}")


def run(host, desired, good, stop_after=None, max_steps=40):
    """One run of the module: (outcome, actions); stops after STOP_AFTER actions (a kill) when given."""
    gates, actions = {}, []
    for _step in range(max_steps):
        action = engine.next_action(desired, record(desired), *host.observe(), gates)
        if action.name in (engine.DONE, engine.FAIL):
            return action.name, actions
        if stop_after is not None and len(actions) == stop_after:
            return "killed", actions
        actions.append(action)
        host.apply(action, desired, gates, good)
    raise AssertionError(f"no end after {max_steps} actions: {[a.name for a in actions]}")


# (name, the deployment that runs at first or None, the deployments whose server passes its gate, desired)
SCENARIOS = {
    "first deployment": (None, {"D"}, "D"),
    "replacement": ("O", {"O", "D"}, "D"),
    "rollback (the new server fails its gate)": ("O", {"O"}, "D"),
    "first deployment that fails its gate": (None, set(), "D"),
    "unchanged server": ("D", {"D"}, "D"),
}
CUTS = ("kill", "power cut, all stopped", "power cut, restart policy", "power cut, last write lost")


def _uncut_actions(initial, good, desired):
    host = Host(initial)
    _outcome, actions = run(host, desired, good)
    return actions


def _cases():
    for label, (initial, good, desired) in SCENARIOS.items():
        for step in range(len(_uncut_actions(initial, good, desired)) + 1):
            for cut in CUTS:
                yield pytest.param(label, step, cut, id=f"{label}: after action {step}, {cut}")


def _cut(host, before, cut):
    """The host as a cut leaves it; BEFORE is the state before the last action."""
    if cut == "kill":
        return host
    if cut == "power cut, last write lost":
        host = before
    running_before = {name: box["running"] for name, box in host.containers.items()}
    for name, box in host.containers.items():
        box["running"] = cut == "power cut, restart policy" and running_before[name]
    return host


def _expect_converged(host, initial, good, desired):
    succeeded = desired in good
    if succeeded:
        assert set(host.containers) == {NAME}
        assert host.containers[NAME]["deployment"] == desired and host.containers[NAME]["running"]
        assert host.record == record(desired)
        if initial and initial != desired:
            assert host.previous == record(initial)
    elif initial:
        assert set(host.containers) == {NAME}
        assert host.containers[NAME]["deployment"] == initial and host.containers[NAME]["running"]
        assert host.record == record(initial) and host.previous is None
    else:
        assert host.containers == {} and host.record is None
    assert host.marker is None


@pytest.mark.parametrize("label,step,cut", list(_cases()))
def test_a_cut_run_is_settled_by_the_next(label, step, cut):
    initial, good, desired = SCENARIOS[label]
    host = Host(initial)
    before = copy.deepcopy(host)
    gates = {}
    for _step in range(step):
        action = engine.next_action(desired, record(desired), *host.observe(), gates)
        before = copy.deepcopy(host)
        host.apply(action, desired, gates, good)
    host = _cut(host, before, cut)
    outcome, _actions = run(host, desired, good)
    assert outcome == (engine.DONE if desired in good else engine.FAIL)
    _expect_converged(host, initial, good, desired)
    # And the run after that changes nothing more than a gate.
    outcome, actions = run(host, desired, good)
    assert outcome == (engine.DONE if desired in good else engine.FAIL)
    if desired in good:
        assert [a.name for a in actions] == [engine.GATE]


@pytest.mark.parametrize("step", range(9))
@pytest.mark.parametrize("cut", CUTS)
def test_a_plan_changed_after_a_cut_replacement_converges_to_the_new_plan(step, cut):
    """Killed on the way from O to D1; the next run wants D2: D2 runs, and the previous record is one that passed."""
    host = Host("O")
    gates, before = {}, copy.deepcopy(host)
    for _step in range(step):
        action = engine.next_action("D1", record("D1"), *host.observe(), gates)
        if action.name in (engine.DONE, engine.FAIL):
            break
        before = copy.deepcopy(host)
        host.apply(action, "D1", gates, {"O", "D1", "D2"})
    host = _cut(host, before, cut)
    outcome, _actions = run(host, "D2", {"O", "D1", "D2"})
    assert outcome == engine.DONE
    assert set(host.containers) == {NAME} and host.containers[NAME]["deployment"] == "D2"
    assert host.record == record("D2") and host.previous in (record("O"), record("D1"))
    assert host.marker is None


def test_the_replacement_sequence():
    """The actions of an uncut replacement, in order (the module's real actions are checked against it)."""
    assert tuple(a.name for a in _uncut_actions("O", {"O", "D"}, "D")) == engine.REPLACEMENT


def test_the_rollback_sequence():
    names = [a.name for a in _uncut_actions("O", {"O"}, "D")]
    assert names == [engine.WRITE_MARKER, engine.STOP_CURRENT, engine.SET_ASIDE, engine.CREATE, engine.GATE,
                     engine.REMOVE_CURRENT, engine.RESTORE_ASIDE, engine.START, engine.REMOVE_MARKER, engine.GATE]


def test_an_unchanged_server_is_only_gated():
    assert [a.name for a in _uncut_actions("D", {"D"}, "D")] == [engine.GATE]


def test_an_unchanged_server_that_fails_its_gate_fails_as_such():
    """Nothing replaced, nothing restored: the failure says the server that ran failed (the module's message)."""
    host = Host("D")
    gates = {}
    action = engine.next_action("D", record("D"), *host.observe(), gates)
    assert action.name == engine.GATE and action.purpose == engine.PURPOSE_UNCHANGED
    gates["D"] = False
    action = engine.next_action("D", record("D"), *host.observe(), gates)
    assert action.name == engine.FAIL and action.why == "the unchanged server failed its gate"
    assert host.containers[NAME]["deployment"] == "D" and host.marker is None


def test_a_stopped_unchanged_server_is_started_then_gated():
    host = Host("D")
    host.containers[NAME]["running"] = False
    outcome, actions = run(host, "D", {"D"})
    assert outcome == engine.DONE and [a.name for a in actions] == [engine.START, engine.GATE]


def test_a_record_that_does_not_describe_the_server_is_written_after_its_gate():
    host = Host("D")
    host.record = None
    outcome, actions = run(host, "D", {"D"})
    assert outcome == engine.DONE and [a.name for a in actions] == [engine.GATE, engine.RECORD]


def test_the_gate_purposes():
    gates = {}
    assert engine.next_action("D", record("D"), engine.Container("D", True), None, None, record("D"), gates).purpose \
        == engine.PURPOSE_UNCHANGED
    marker = {"deployment": "D", "new": record("D"), "replaced": record("O")}
    assert engine.next_action("D", record("D"), engine.Container("D", True), engine.Container("O", False), marker,
                              record("O"), gates).purpose == engine.PURPOSE_NEW
    # The marker of another deployment than the desired one: its server is gated for its place first.
    assert engine.next_action("D2", record("D2"), engine.Container("D", True), engine.Container("O", False), marker,
                              record("O"), gates).purpose == engine.PURPOSE_PENDING
    # After the new deployment failed here, the restored server is gated before the run fails.
    assert engine.next_action("D", record("D"), engine.Container("O", True), None, None, record("O"),
                              {"D": False}).purpose == engine.PURPOSE_RESTORED


def test_a_server_the_interrupted_run_was_to_replace_is_started_again_and_kept():
    """Killed after the marker, before the stop took effect, and the plan went back: O stays, started."""
    marker = {"deployment": "D", "new": record("D"), "replaced": record("O")}
    host = Host("O")
    host.marker = marker
    host.containers[NAME]["running"] = False
    outcome, actions = run(host, "O", {"O", "D"})
    assert outcome == engine.DONE
    assert [a.name for a in actions] == [engine.START, engine.REMOVE_MARKER, engine.GATE]
    assert host.record == record("O") and host.previous is None


def test_an_empty_desired_deployment_is_refused():
    with pytest.raises(ValueError):
        engine.next_action("", {}, None, None, None, None, {})


def test_what_a_call_did_is_said_in_one_line():
    replaced = {"changed": True, "actions": [{"action": engine.WRITE_MARKER}, {"action": engine.CREATE},
                                             {"action": engine.GATE}],
                "known_answers": {"outcome": "passed"}}
    assert engine.said("ws1", "vllm", replaced) == "ws1/vllm: write_marker → create → gate"
    assert engine.said("ws1", "vllm", {"changed": False, "actions": []}) == "ws1/vllm: nothing to do"
    assert not engine.differing_answers_warning("ws1", "vllm", replaced)


def test_recorded_answers_are_said():
    recorded = {"changed": True, "actions": [{"action": engine.GATE}],
                "known_answers": {"outcome": "recorded", "note": "no answers were recorded for this model"}}
    assert engine.said("ws1", "vllm", recorded).endswith("; known answers: no answers were recorded for this model")
    assert not engine.differing_answers_warning("ws1", "vllm", recorded)


def test_differing_answers_let_pass_are_said_and_warned_of():
    differs = {"changed": False, "actions": [{"action": engine.GATE}],
               "known_answers": {"outcome": "differs", "failures": ["prompt 2: token 3 differs", "prompt 5"]}}
    assert engine.said("ws1", "vllm", differs) == "ws1/vllm: gate; known answers: differs"
    warning = engine.differing_answers_warning("ws1", "vllm", differs)
    assert "ws1/vllm answers 2 of its known-answer prompts differently" in warning
    assert warning.endswith("prompt 2: token 3 differs")
