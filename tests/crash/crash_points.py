# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every crash point of one host's rollout: kill the play after each task, and the deployment module after each of
its actions, re-run it, check the fleet converged.

    make test-crash            (brings the fleet scenario's lab up, runs this, takes it down)
    python3 tests/crash/crash_points.py -i <inventory> [--host fleet-ws1] [--power-cut-every 4] [--rollback-every 3]

Against a converged lab fleet with two image tags staged (the fleet scenario's v0.32.0 and v0.32.0-lab2):
  1. one rollout of --host to the other tag, run whole, lists the tasks of its path (the crash_at callback's log) and
     the actions onprem.vllm.vllm_deployment took, which must be the decision core's replacement
     (module_utils/deployment_engine.py REPLACEMENT);
  2. for each task that acted on the host or the gateway (a task that only sets a fact, prints, asserts or includes, or
     that was skipped, leaves host and gateway as the task before it did), the same rollout is SIGKILLed right after
     that task (the callback kills ansible-playbook when the next task starts) - at every --power-cut-every'th point
     the host's lab container is `docker kill`ed first and started again (a power cut); then the same for each action
     of the replacement, inside the module (its test-only fault_after: the module kills itself after the action, and
     ansible-playbook is killed at the next task);
  3. the same command is re-run, and the fleet must have converged: the re-run succeeded, the host serves the new
     tag, nothing is set aside, no marker is left, every host is UP at the gateway, the records name the new tag and,
     as previous, the tag the host ran before;
  4. at every --rollback-every'th point, playbooks/rollback.yml -l host must then restore that previous tag.
Each point starts from the state the one before left (the host on one tag or the other). One row per point, then
"N points, M converged". Results (logs, rows as JSON lines) under --out. Needs only Python's standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.onprem.vllm.plugins.module_utils import deployment_engine  # noqa: E402

# The task after the deployment module's when it dies (the rescue's first): a kill there lands right after what the
# module did.
AFTER_DEPLOYMENT = "Remember why the host failed"
CALLBACKS = os.path.join(ROOT, "tests", "crash", "callback_plugins")
# Tasks that act on neither the host nor the gateway: a kill after one leaves what the task before it left.
CONTROLLER_ONLY = {"set_fact", "ansible.builtin.set_fact", "debug", "ansible.builtin.debug", "assert",
                   "ansible.builtin.assert", "include_tasks", "ansible.builtin.include_tasks", "include_role",
                   "ansible.builtin.include_role", "import_tasks", "meta", "ansible.builtin.meta", "fail",
                   "ansible.builtin.fail", "ansible.builtin.validate_argument_spec", "validate_argument_spec"}
HOST_STATE = r"""
import json, os, subprocess
def box(name):
    p = subprocess.run(["docker", "inspect", name], capture_output=True, text=True)
    if p.returncode:
        return None
    c = json.loads(p.stdout)[0]
    return {"id": c["Id"][:12], "image": c["Config"]["Image"], "running": c["State"]["Running"]}
def image(path):
    try:
        return json.load(open(path))["image"]
    except OSError:
        return None
d = "/etc/onprem-vllm/"
print(json.dumps({"vllm": box("vllm"), "previous": box("vllm-previous"), "marker": os.path.exists(d + "vllm.rollout.json"),
                  "record": image(d + "vllm.deployment.json"), "previous_record": image(d + "vllm.deployment.previous.json")}))
"""
GATEWAY_STATE = (
    "import socket, json; s=socket.socket(socket.AF_UNIX); s.connect('/run/onprem-gateway/admin.sock');"
    "s.sendall(b'show stat\\n'); rows=[l.split(',') for l in s.makefile().read().splitlines() if l.startswith('vllm-chat,')];"
    "print(json.dumps({r[1]: r[17] for r in rows if r[1] not in ('BACKEND', 'FRONTEND')}))")


def tag(image):
    """The tag of repo:tag or repo:tag@sha256:digest (None for none)."""
    return image.split("@")[0].rsplit(":", 1)[1] if image else None


def state(host, gateway):
    out = subprocess.run(["docker", "exec", host, "python3", "-c", HOST_STATE], capture_output=True, text=True, check=False)
    gw = subprocess.run(["docker", "exec", gateway, "python3", "-c", GATEWAY_STATE], capture_output=True, text=True,
                        check=False)
    result = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr.strip()[-200:]}
    result["gateway"] = json.loads(gw.stdout) if gw.returncode == 0 else {"error": gw.stderr.strip()[-200:]}
    return result


def summary(s):
    """One short line: what serves under the name, what is set aside, the marker, the host at the gateway."""
    if "error" in s:
        return "host unreadable"
    box = s["vllm"]
    serving = f"{tag(box['image'])}{'' if box['running'] else ' (stopped)'}" if box else "none"
    aside = f", aside {tag(s['previous']['image'])}" if s["previous"] else ""
    return f"vllm {serving}{aside}{', marker' if s['marker'] else ''}"


class Runner:
    def __init__(self, args):
        self.args = args
        self.playbook = args.ansible_playbook
        os.makedirs(args.out, exist_ok=True)

    def play(self, name, book, target_tag, fault_after="", **crash):
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1",
                   ANSIBLE_CALLBACK_PLUGINS=CALLBACKS, ANSIBLE_CALLBACKS_ENABLED="crash_at")
        env.update({f"ONPREM_CRASH_{key.upper()}": str(value) for key, value in crash.items()})
        # -v: the deployment module's one line of what it did (module_actions) is shown with -v.
        argv = [self.playbook, os.path.join(ROOT, "playbooks", book), "-i", self.args.inventory, "-l", self.args.host,
                "-v"]
        if target_tag:
            argv += ["-e", json.dumps({"onprem_vllm_image_tag": target_tag})]
        if fault_after:
            argv += ["-e", "_vllm_server_fault_after=" + fault_after]
        started = time.monotonic()
        with open(os.path.join(self.args.out, name), "w") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                check=False).returncode
        return rc, round(time.monotonic() - started)

    def power_on(self):
        subprocess.run(["docker", "start", self.args.host], capture_output=True, check=True)
        end = time.monotonic() + 300
        while subprocess.run(["docker", "exec", self.args.host, "docker", "info"], capture_output=True,
                             check=False).returncode:
            if time.monotonic() > end:
                raise SystemExit(f"{self.args.host}'s Docker did not come back in 300 s after the power cut")
            time.sleep(1)


def path_tasks(log_file):
    """[(index, name, action, status of the host)] of a whole run's log."""
    tasks, statuses = {}, {}
    with open(log_file) as handle:
        for line in handle:
            record = json.loads(line)
            if "name" in record:
                tasks[record["index"]] = (record["name"], record["action"])
            elif "status" in record:
                statuses.setdefault(record["index"], record["status"])
    return [(index, name, action, statuses.get(index, "none")) for index, (name, action) in sorted(tasks.items())]


def module_actions(log_file, host):
    """The actions the deployment module reported for HOST in a whole run's output ("host/vllm: a → b → c"; the
    output callback may wrap the message over lines)."""
    with open(log_file) as handle:
        text = " ".join(handle.read().split())
    found = re.search(re.escape(host) + r"/vllm: ([a-z_ →]+)", text)
    return tuple(part.strip() for part in found.group(1).split("→")) if found else ()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--host", default="fleet-ws1")
    parser.add_argument("--gateway", default="fleet-gw")
    parser.add_argument("--tags", default="v0.32.0,v0.32.0-lab2", help="the two staged image tags")
    parser.add_argument("--power-cut-every", type=int, default=4, help="every Nth point is a power cut (0: none)")
    parser.add_argument("--rollback-every", type=int, default=3, help="rollback.yml after every Nth point (0: none)")
    parser.add_argument("--points", default="", help="only these task indexes (comma-separated), e.g. to repeat one")
    parser.add_argument("--task", action="append", default=[],
                        help="only the points after a task whose name holds this text (repeatable)")
    parser.add_argument("--out", default=os.path.join(ROOT, ".cache", "crash-points"))
    parser.add_argument("--ansible-playbook", default=os.path.join(os.path.dirname(sys.executable), "ansible-playbook"))
    args = parser.parse_args()
    run = Runner(args)
    tags = args.tags.split(",")

    start = state(args.host, args.gateway)
    if "error" in start or not (start["vllm"] and start["vllm"]["running"]) or start["previous"] or start["marker"]:
        raise SystemExit(f"the fleet must start converged: {start}")
    current = tag(start["record"])
    other = tags[1] if current == tags[0] else tags[0]

    discovery = os.path.join(args.out, "path.jsonl")
    if os.path.exists(discovery):
        os.unlink(discovery)
    rc, seconds = run.play("path.log", "rollout.yml", other, log=discovery)
    if rc:
        raise SystemExit(f"the whole rollout {current} -> {other} failed (rc {rc}): see {args.out}/path.log")
    print(f"the whole rollout of {args.host}, {current} -> {other}: {seconds} s")
    actions = module_actions(os.path.join(args.out, "path.log"), args.host)
    if actions != deployment_engine.REPLACEMENT:
        raise SystemExit(f"the module's actions {actions} are not the decision core's replacement "
                         f"{deployment_engine.REPLACEMENT}")
    current, other = other, current
    tasks = path_tasks(discovery)
    acting = [t for t in tasks if t[2] not in CONTROLLER_ONLY and t[3] in ("ok", "changed")]
    wanted = {int(i) for i in args.points.split(",") if i}
    points = [t for t in acting if (not wanted or t[0] in wanted)
              and (not args.task or any(text in t[1] for text in args.task))]
    # The module's own points: after each action of the replacement (index None: found by the task after it).
    if not wanted and not args.task:
        points += [(None, "vllm_deployment after " + action, "fault_after", action) for action in actions]
    print(f"{len(tasks)} tasks on the path, {len(acting)} acted on the host or the gateway, {len(actions)} actions in "
          f"the deployment module; {len(points)} points to run")

    rows = []
    with open(os.path.join(args.out, "rows.jsonl"), "w") as rows_file:
        for number, (index, name, kind, action) in enumerate(points, 1):
            power_cut = args.power_cut_every and number % args.power_cut_every == 0
            rollback = args.rollback_every and number % args.rollback_every == 0
            before = state(args.host, args.gateway)
            label = f"{index:03d}" if index is not None else "module-" + action
            crash = {"at_index": index + 1} if index is not None else {"at_task": AFTER_DEPLOYMENT}
            if power_cut:
                crash["power_cut"] = args.host
            killed_rc, _killed_s = run.play(f"{label}-killed.log", "rollout.yml", other,
                                            fault_after=action if kind == "fault_after" else "", **crash)
            if power_cut:
                run.power_on()
            left = state(args.host, args.gateway)
            rerun_rc, rerun_s = run.play(f"{label}-rerun.log", "rollout.yml", other)
            after = state(args.host, args.gateway)
            problems = []
            if killed_rc != -9:
                problems.append(f"the kill did not land (rc {killed_rc})")
            if rerun_rc:
                problems.append(f"re-run rc {rerun_rc}")
            if "error" in after:
                problems.append("host unreadable")
            else:
                if not (after["vllm"] and after["vllm"]["running"] and tag(after["vllm"]["image"]) == other):
                    problems.append(f"serves {summary(after)}")
                if after["previous"] or after["marker"]:
                    problems.append("left set aside or marked")
                if tag(after["record"]) != other or tag(after["previous_record"]) != current:
                    problems.append(f"records {tag(after['record'])}/{tag(after['previous_record'])}")
                if any(status != "UP" for status in after["gateway"].values()):
                    problems.append(f"gateway {after['gateway']}")
            rolled_back = ""
            if rollback and not problems:
                rb_rc, rb_s = run.play(f"{label}-rollback.log", "rollback.yml", None)
                back = state(args.host, args.gateway)
                ok = (rb_rc == 0 and back["vllm"] and tag(back["vllm"]["image"]) == current
                      and tag(back["record"]) == current and tag(back["previous_record"]) == other)
                rolled_back = f"restored {current} ({rb_s} s)" if ok else f"FAILED: {summary(back)}"
                if not ok:
                    problems.append("rollback.yml did not restore the predecessor")
                else:
                    current, other = other, current  # the host is back on the tag it ran before this point
            current, other = other, current
            row = {"index": index, "task": name, "fault": "power cut" if power_cut else "kill",
                   "before": summary(before), "left": summary(left) + f", gateway {left['gateway'].get(args.host, '?')}",
                   "rerun_s": rerun_s, "converged": not problems, "problems": problems, "rollback": rolled_back}
            rows.append(row)
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
            print(f"{label:>3} | {row['fault']:9} | {name[-70:]:70} | left: {row['left']:40} | re-run {rerun_s:3d} s"
                  f" | {'converged' if not problems else 'NOT converged: ' + '; '.join(problems)}"
                  f"{' | rollback ' + rolled_back if rolled_back else ''}", flush=True)
    converged = sum(row["converged"] for row in rows)
    print(f"{len(rows)} points, {converged} converged")
    return 0 if converged == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
