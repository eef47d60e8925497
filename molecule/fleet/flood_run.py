# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The flood check of security_checks.yml, run on the controller: flood.py from one lab host (docker exec, the
attacker's address) against the gateway, and while its connections are held, one keyed request from another host
through security_probe.py. Reads {attacker, client, host, port, tls, connections, keyed} as JSON on stdin (the keyed
request's spec holds a client key, so nothing here is an argument) and prints one JSON object: how the flood's
connections ended (refused at accept, answered 408, anything else), the most held at once, the longest hold, and the
keyed request's answer and seconds. Never prints the key."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = json.load(sys.stdin)
with open(os.path.join(HERE, "flood.py"), encoding="utf-8") as script:
    flood_code = script.read()
with open(os.path.join(HERE, "security_probe.py"), encoding="utf-8") as script:
    probe_code = script.read()

argv = ["docker", "exec", "-i", spec["attacker"], "python3", "-", spec["host"], str(spec["port"]),
        str(spec["connections"])] + (["tls"] if spec["tls"] else [])
with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as flood:
    flood.stdin.write(flood_code)
    flood.stdin.close()
    first = flood.stdout.readline().strip()
    started = time.monotonic()
    keyed = subprocess.run(["docker", "exec", "-i", spec["client"], "python3", "-c", probe_code],
                           input=json.dumps([spec["keyed"]]), capture_output=True, text=True, check=False)
    keyed_seconds = round(time.monotonic() - started, 2)
    flooded = json.loads(flood.stdout.read() or "[]")
held = [one for one in flooded if one["status"] is not None]
print(json.dumps({
    "flood_started": first == "holding",
    "ended": len(flooded),
    "refused_at_accept": sum(1 for one in flooded if one["status"] is None),
    "statuses": sorted({one["status"] for one in held}),
    # Held at once: the most whose span covers one's start (the flood notes a close before its next connection, so a
    # slot freed between the two may count one more).
    "held_at_once": max((sum(1 for other in held if other["started"] <= one["started"] < other["seconds"])
                         for one in held), default=0),
    "longest_hold_s": max((round(one["seconds"] - one["started"], 2) for one in held), default=0),
    "opened_in_s": max((one["started"] for one in flooded), default=0),
    "keyed": json.loads(keyed.stdout) if keyed.returncode == 0 and keyed.stdout.strip() else
    {"error": keyed.stderr[-400:]},
    "keyed_seconds": keyed_seconds}))
