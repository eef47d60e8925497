# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decision core of a vLLM deployment on one host: (desired, observed) -> the next action. No I/O.

The module onprem.vllm.vllm_deployment observes the host, asks next_action() what to do, does it, observes again,
until the answer is DONE or FAIL. Each action is idempotent, so a run killed anywhere (or a power cut that loses the
last action) leaves a state this function settles on the next run: level-triggered, like a Kubernetes controller.

What the host holds, for the server whose container is NAME:
  - current: the container NAME (its label onprem.vllm.deployment and whether it runs), or None;
  - aside:   the container NAME-previous, the server a replacement stopped and set aside, or None;
  - marker:  the in-progress marker {"deployment": id, "new": record, "replaced": record or None}, written before the
             running server is touched and removed once the replacement is settled (module_utils/deployment_record);
  - record:  the current deployment record (the last deployment that passed a gate here), without its kv_cache entry.
What this run learned: gates = {deployment id: passed} for the container under NAME that carries that id.

The one invariant: no container that last passed a gate is removed before its successor passed one. A replacement
(marker D) goes forward: stop the running server, set it aside, create D, gate D, write the records, remove the one
set aside, remove the marker. A failed gate, or a marker for another deployment than the desired one, settles back:
remove the unverified server, put the one set aside back, start it. A deployment that failed its gate in this run is
not tried again in it: the run ends in FAIL once the previous server is back and gated.
"""
from __future__ import annotations

from dataclasses import dataclass

# Terminal answers.
DONE = "done"
FAIL = "fail"
# Actions (the module acts on each; tests/unit/plugins/module_utils/test_deployment_engine.py simulates them).
START = "start"                   # start NAME
GATE = "gate"                     # health gate (+ known answers, benchmark) on NAME; purpose says which gates
RECORD = "record"                 # write the current record for the unchanged server that passed its gate
FINISH_RECORDS = "finish_records"  # the marker's records: previous = replaced, current = new
REMOVE_ASIDE = "remove_aside"     # remove NAME-previous
REMOVE_CURRENT = "remove_current"  # remove NAME
RESTORE_ASIDE = "restore_aside"   # rename NAME-previous -> NAME
REMOVE_MARKER = "remove_marker"
WRITE_MARKER = "write_marker"     # the marker for the desired deployment, replacing the current record
STOP_CURRENT = "stop_current"
SET_ASIDE = "set_aside"           # rename NAME -> NAME-previous
CREATE = "create"                 # create and start NAME as the desired deployment

# What the gate of a server is for: the module picks the gates by it (known answers: gate a new or pending server,
# record missing answers of an unchanged one, none on a restored one).
PURPOSE_NEW = "new"
PURPOSE_PENDING = "pending"
PURPOSE_UNCHANGED = "unchanged"
PURPOSE_RESTORED = "restored"

# An uncut replacement, in order (the unit tests derive it from next_action; tests/crash/crash_points.py checks the
# module's real actions against it and kills a rollout after each).
REPLACEMENT = (WRITE_MARKER, STOP_CURRENT, SET_ASIDE, CREATE, GATE, FINISH_RECORDS, REMOVE_ASIDE, REMOVE_MARKER)

# The actions that change the running server: prepare (before the gateway's drain) stops at the first of them.
REPLACING = frozenset({WRITE_MARKER, STOP_CURRENT, SET_ASIDE, CREATE})


@dataclass(frozen=True)
class Container:
    deployment: str
    running: bool


@dataclass(frozen=True)
class Action:
    name: str
    purpose: str = ""
    why: str = ""


def _finished(marker, record) -> bool:
    """Whether the marker's records are written (the current record is its new one): its deployment passed a gate."""
    return bool(marker) and record is not None and record == marker.get("new")


def _gate_or_start(container: Container, gates: dict, purpose: str, why: str):
    """Start a stopped container, else gate one not gated in this run; None once its gate is known."""
    if container.deployment in gates:
        return None
    if not container.running:
        return Action(START, purpose, why + " (it is stopped: started first)")
    return Action(GATE, purpose, why)


def _settle(desired, current, aside, marker, record, gates):
    """Back to the last server that passed: the marker is not the desired deployment, or it failed its gate here."""
    pending = marker.get("deployment") if marker else None
    if current is not None and (marker is None or current.deployment == pending):
        step = _gate_or_start(current, gates, PURPOSE_PENDING, "the server an interrupted run started")
        if step:
            return step
        if gates[current.deployment]:
            if marker and not _finished(marker, record):
                return Action(FINISH_RECORDS, why="the interrupted run's server passed its gate")
            if aside is not None:
                return Action(REMOVE_ASIDE, why="its successor passed its gate")
            return Action(REMOVE_MARKER, why="the interrupted run is settled")
        if aside is not None:
            return Action(REMOVE_CURRENT, why="it failed its gate; the server set aside is restored")
        if marker and not _finished(marker, record):
            # A first deployment that never passed: nothing else to keep, nothing half-started is left.
            return Action(REMOVE_CURRENT, why="a first deployment that failed its gate")
        return Action(REMOVE_MARKER, why="the interrupted run is settled")
    if current is not None:
        # Not the marker's deployment: the server the interrupted run was to replace (killed before the set-aside),
        # or, beside a server set aside, one no deployment gated.
        if aside is not None:
            return Action(REMOVE_CURRENT, why="a server no deployment gated, beside the one set aside")
        if not current.running:
            return Action(START, why="the server an interrupted run stopped")
        return Action(REMOVE_MARKER, why="the interrupted run is settled")
    if aside is not None:
        return Action(RESTORE_ASIDE, why="nothing runs under the name: the server set aside is put back")
    return Action(REMOVE_MARKER, why="the interrupted run is settled")


def _forward(desired, current, aside, marker, record, gates):
    """The replacement by the desired deployment, which its marker announces."""
    if current is None:
        return Action(CREATE, why="the new server")
    if current.deployment == desired:
        step = _gate_or_start(current, gates, PURPOSE_NEW, "the new server")
        if step:
            return step
        # Passed (a failure settles back): the records, then the server set aside, then the marker.
        if not _finished(marker, record):
            return Action(FINISH_RECORDS, why="the new server passed its gate")
        if aside is not None:
            return Action(REMOVE_ASIDE, why="its successor passed its gate")
        return Action(REMOVE_MARKER, why="the replacement is done")
    if aside is not None:
        return _settle(desired, current, aside, marker, record, gates)
    if current.running:
        return Action(STOP_CURRENT, why="replaced by the new deployment")
    return Action(SET_ASIDE, why="kept for a rollback until the new server passed its gate")


def next_action(desired: str, desired_record: dict, current, aside, marker, record, gates: dict) -> Action:
    """The next action towards DESIRED (the deployment id, whose record is DESIRED_RECORD), given what the host holds
    and the gates of this run."""
    if not desired:
        raise ValueError("the desired deployment id is empty")
    failed_here = gates.get(desired) is False
    if marker is not None or aside is not None:
        if marker is not None and marker.get("deployment") == desired and not failed_here:
            return _forward(desired, current, aside, marker, record, gates)
        return _settle(desired, current, aside, marker, record, gates)
    if failed_here:
        if current is not None and current.deployment == desired:
            # No marker: this run replaced nothing (a failed replacement settles back), the server ran before it.
            return Action(FAIL, why="the unchanged server failed its gate")
        if current is not None and current.deployment != desired:
            step = _gate_or_start(current, gates, PURPOSE_RESTORED, "the restored server")
            if step:
                return step
        return Action(FAIL, why="the new deployment failed its gate")
    if current is None:
        return Action(WRITE_MARKER, why="a first deployment")
    if current.deployment != desired:
        return Action(WRITE_MARKER, why="the deployment changed")
    step = _gate_or_start(current, gates, PURPOSE_UNCHANGED, "the unchanged server")
    if step:
        return step
    if record != desired_record:
        return Action(RECORD, why="the record does not describe the server that runs")
    return Action(DONE)


def said(host_name: str, name: str, result: dict) -> str:
    """One line of what a deployment call did: its actions in order ('nothing to do' when none), and the known-answer
    gate's outcome where it recorded answers or let differing ones pass."""
    actions = " → ".join(a["action"] for a in result.get("actions") or [])
    line = "%s/%s: %s" % (host_name, name, actions or "nothing to do")
    known = result.get("known_answers") or {}
    if known.get("outcome") in ("recorded", "differs"):
        line += "; known answers: %s" % (known.get("note") or known["outcome"])
    return line


def differing_answers_warning(host_name: str, name: str, result: dict) -> str:
    """A warning where the known-answer gate let differing answers pass (vllm_server_known_answers: record_missing
    keeps serving a server whose answers moved), else ''."""
    known = result.get("known_answers") or {}
    if known.get("outcome") != "differs":
        return ""
    return ("%s/%s answers %d of its known-answer prompts differently from the answers recorded on the host, and was "
            "kept (the known-answer gate only records missing answers): %s" % (
                host_name, name, len(known.get("failures") or []), (known.get("failures") or ["no detail"])[0]))
