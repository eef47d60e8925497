# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm Xid monitor: new NVIDIA Xid events in the kernel log → the journal (and optionally a webhook).

Run by onprem-vllm-xid-monitor.timer. The parser and the severity table are gpu_health's own
(plugins/module_utils/gpu_health_checks.py, installed next to this file): one Xid parser in the codebase.

Sources: the kernel journal (`journalctl -k`, from a saved cursor) and any extra files given with --log-file (from a
saved offset; e.g. /var/log/kern.log). Each new event is written to stdout with a syslog priority prefix (systemd puts
it in the journal under this unit: block → crit, warn → warning, info → info) and appended as JSON to --event-log.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_health_checks import parse_xid_events  # noqa: E402  pylint: disable=wrong-import-position

PRIORITY = {"block": 2, "warn": 4, "info": 6}


def load_state(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def save_state(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(state, handle)
    os.replace(tmp, path)


def read_journal(cursor):
    cmd = ["journalctl", "-k", "-o", "short-iso", "--no-pager", "--show-cursor"]
    cmd += ["--after-cursor", cursor] if cursor else ["-b"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return "", cursor, "journalctl -k failed: %s" % proc.stderr.strip()[-200:]
    lines, new_cursor = [], cursor
    for line in proc.stdout.splitlines():
        if line.startswith("-- cursor: "):
            new_cursor = line[len("-- cursor: "):].strip()
        else:
            lines.append(line)
    return "\n".join(lines), new_cursor, None


def read_file(path, offset):
    try:
        size = os.path.getsize(path)
    except OSError:
        return "", 0
    if size < offset:  # rotated or truncated: start over
        offset = 0
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    return data.decode("utf-8", "replace"), offset + len(data)


def post_webhook(url, host, events, timeout=10):
    parts = ["Xid %d (%s) on GPU %s: %s" % (e["code"], e["severity"], e["pci_bus_id"], e["description"])
             for e in events]
    text = "%s: %s" % (host, "; ".join(parts))
    body = json.dumps({"text": text, "host": host, "events": events}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (operator-given URL)
        return response.status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", default="/var/lib/onprem-vllm/xid-monitor.json")
    parser.add_argument("--event-log", default="/var/log/onprem-vllm/xid-events.log")
    parser.add_argument("--log-file", action="append", default=[])
    parser.add_argument("--ignore", action="append", type=int, default=[])
    parser.add_argument("--no-journal", action="store_true", help="do not read the kernel journal")
    args = parser.parse_args(argv)
    webhook = os.environ.get("XID_WEBHOOK_URL", "").strip()
    host = socket.gethostname()

    state = load_state(args.state)
    texts = []
    if not args.no_journal:
        text, cursor, error = read_journal(state.get("cursor"))
        if error:
            print("<4>xid-monitor: %s" % error)
        texts.append(text)
        state["cursor"] = cursor
    offsets = state.setdefault("offsets", {})
    for path in args.log_file:
        text, offsets[path] = read_file(path, int(offsets.get(path, 0)))
        texts.append(text)

    events = parse_xid_events("\n".join(texts), ignore=args.ignore)
    for event in events:
        print("<%d>Xid %d on GPU %s severity=%s: %s (log: %s)" % (
            PRIORITY.get(event["severity"], 4), event["code"], event["pci_bus_id"], event["severity"],
            event["description"], event["message"][:200]))
    if events:
        os.makedirs(os.path.dirname(args.event_log), exist_ok=True)
        with open(args.event_log, "a") as handle:
            for event in events:
                handle.write(json.dumps(dict(event, host=host), sort_keys=True) + "\n")
        if webhook:
            try:
                post_webhook(webhook, host, events)
            except Exception as exc:  # pylint: disable=broad-except
                print("<4>xid-monitor: webhook failed: %s" % exc)
    else:
        print("<7>xid-monitor: no new Xid events")
    save_state(args.state, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
