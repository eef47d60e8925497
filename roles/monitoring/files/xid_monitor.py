# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""onprem.vllm Xid monitor: new NVIDIA Xid events in the kernel log → the journal, metrics, and optionally a webhook.

Run by onprem-vllm-xid-monitor.timer. The parser and the severity table are gpu_health_info's own
(plugins/module_utils/gpu_health_checks.py, installed next to this file): one Xid parser in the codebase.

Sources: the kernel journal (`journalctl -k`, from a saved cursor) and any extra files given with --log-file (from a
saved offset; e.g. /var/log/kern.log). Each new event is written to stdout with a syslog priority prefix (systemd puts
it in the journal under this unit: block → crit, warn → warning, info → info) and appended as JSON to --event-log.

A source that cannot be read makes the run exit 1 (systemd marks the unit failed) without moving its cursor, so the
next run reads what this one missed. A webhook post that fails is kept in --spool and sent again, oldest first, by the
next runs. With --textfile the run writes its result for node_exporter's textfile collector (the alert rules read it).

With --drain-flag, an event whose code is a --drain-code takes the host out of rotation: the flag (JSON: the events,
when the first came) is written before anything else happens, and the servers' middleware answers 503 on /health
while it exists, so every gateway's health checks stop sending the host requests within seconds, and a restarted
server (its restart policy) stays out too. Only an operator removes it, with playbooks/gpu_return.yml, which re-checks
the GPUs, sets the flag aside (gpu_fault_flag.py, installed next to this file) while it gates the servers, and
removes it once they are back in rotation. A new critical Xid meanwhile writes the flag again.

systemd runs it with --follow SECONDS: one process reading the sources every SECONDS (a critical Xid drains within
them). A source that cannot be read is then reported (journal once, textfile every poll) and read again at the next
poll; a one-shot run (no --follow) exits 1 instead.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_fault_flag import returning_path  # noqa: E402  pylint: disable=wrong-import-position
from gpu_health_checks import parse_xid_events  # noqa: E402  pylint: disable=wrong-import-position

PRIORITY = {"block": 2, "warn": 4, "info": 6}
SEVERITIES = ("block", "warn", "info")
# A webhook that keeps failing is tried again this often in --follow mode, not at every poll (each try may wait 10 s).
RESEND_EVERY_S = 60


def load_json(path, default):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def fsync_dir(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, text):
    """The new content on disk before it replaces the old (fsync, rename, fsync of the folder): a power cut leaves the
    old file or the new one, never an empty one and never a journal position ahead of what it stands for."""
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path)


def read_journal(cursor):
    cmd = ["journalctl", "-k", "-o", "short-iso", "--no-pager", "--show-cursor"]
    cmd += ["--after-cursor", cursor] if cursor else ["-b"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        return "", cursor, "journalctl could not run: %s" % exc
    # systemd 252's journalctl exits 1 when nothing matches ("-- No entries --" on stdout, nothing on stderr), e.g.
    # no kernel line since the cursor: not a failure.
    if proc.returncode == 1 and proc.stdout.strip() == "-- No entries --" and not proc.stderr.strip():
        return "", cursor, None
    if proc.returncode != 0:
        return "", cursor, "journalctl -k failed (exit %d): %s" % (proc.returncode, proc.stderr.strip()[-200:])
    lines, new_cursor = [], cursor
    for line in proc.stdout.splitlines():
        if line.startswith("-- cursor: "):
            new_cursor = line[len("-- cursor: "):].strip()
        else:
            lines.append(line)
    return "\n".join(lines), new_cursor, None


def read_file(path, offset):
    """(text, new offset, error). A missing file is not an error (rsyslog may not have written it yet)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return "", 0, None
    except OSError as exc:
        return "", offset, "%s: %s" % (path, exc)
    if size < offset:  # rotated or truncated: start over
        offset = 0
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError as exc:
        return "", offset, "%s: %s" % (path, exc)
    return data.decode("utf-8", "replace"), offset + len(data), None


def webhook_payload(host, events):
    parts = ["Xid %d (%s) on GPU %s: %s" % (e["code"], e["severity"], e["pci_bus_id"] or "(unknown bus id)", e["description"])
             for e in events]
    return {"text": "%s: %s" % (host, "; ".join(parts)), "host": host, "events": events}


def post_webhook(url, payload, timeout=10):
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (operator-given URL)
        return response.status


def deliver(url, spool_path, payload):
    """Send the spooled payloads, oldest first, then this run's; keep what could not be sent. Returns how many are kept."""
    pending = load_json(spool_path, [])
    if payload is not None:
        pending.append(payload)
    sent = 0
    for index, item in enumerate(pending):
        try:
            post_webhook(url, item)
        except Exception as exc:  # pylint: disable=broad-except
            print("<4>xid-monitor: webhook failed, %d alert(s) kept for the next run: %s" % (len(pending) - index, exc))
            break
        sent += 1
    kept = pending[sent:]
    if kept or os.path.exists(spool_path):
        write_atomic(spool_path, json.dumps(kept))
    return len(kept)


def metrics_text(state, ok, spooled, now, flags=()):
    """flags: the contents of the drain flag and of the flag a return set aside (None for a file that is absent)."""
    lines = [
        "# HELP onprem_vllm_xid_monitor_last_run_success 1 when the last run read every kernel log source.",
        "# TYPE onprem_vllm_xid_monitor_last_run_success gauge",
        "onprem_vllm_xid_monitor_last_run_success %d" % (1 if ok else 0),
        "# HELP onprem_vllm_xid_monitor_last_run_timestamp_seconds When the monitor last ran.",
        "# TYPE onprem_vllm_xid_monitor_last_run_timestamp_seconds gauge",
        "onprem_vllm_xid_monitor_last_run_timestamp_seconds %d" % now,
        "# HELP onprem_vllm_xid_monitor_last_success_timestamp_seconds When a run last read every source.",
        "# TYPE onprem_vllm_xid_monitor_last_success_timestamp_seconds gauge",
        "onprem_vllm_xid_monitor_last_success_timestamp_seconds %d" % state.get("last_success", 0),
        "# HELP onprem_vllm_xid_webhook_spooled Xid alerts whose webhook post failed, waiting to be sent again.",
        "# TYPE onprem_vllm_xid_webhook_spooled gauge",
        "onprem_vllm_xid_webhook_spooled %d" % spooled,
        "# HELP onprem_vllm_xid_events_total Xid events seen, by gpu_health_info's severity (xid_severity).",
        "# TYPE onprem_vllm_xid_events_total counter",
    ]
    counts = state.get("counts", {})
    lines += ['onprem_vllm_xid_events_total{xid_severity="%s"} %d' % (s, counts.get(s, 0)) for s in SEVERITIES]
    lines += [
        "# HELP onprem_vllm_xid_last_event_timestamp_seconds When the monitor last saw this Xid code on this GPU.",
        "# TYPE onprem_vllm_xid_last_event_timestamp_seconds gauge",
    ]
    for key, seen in sorted(state.get("last_seen", {}).items()):
        code, bus, severity = key.split("|")
        lines.append('onprem_vllm_xid_last_event_timestamp_seconds{code="%s",pci_bus_id="%s",xid_severity="%s"} %d'
                     % (code, bus, severity, seen))
    lines += [
        "# HELP onprem_vllm_xid_drained 1 for each Xid (code, GPU) that took the host out of rotation (the drain flag,"
        " or the flag set aside by a return that has not put the host back).",
        "# TYPE onprem_vllm_xid_drained gauge",
    ]
    drained = {(e["code"], e["pci_bus_id"] or "unknown") for flag in flags for e in (flag or {}).get("events", [])}
    for code, bus in sorted(drained):
        lines.append('onprem_vllm_xid_drained{code="%d",pci_bus_id="%s"} 1' % (code, bus))
    return "\n".join(lines) + "\n"


def drain(flag, current, host, events, now):
    """Write (or extend) the drain flag, whose content is `current` (None: no flag yet), with the critical events;
    returns its new content."""
    current = current or {"host": host, "since": now, "events": []}
    current["events"] = current.get("events", []) + [
        {"code": e["code"], "pci_bus_id": e["pci_bus_id"], "severity": e["severity"], "description": e["description"],
         "seen": now} for e in events]
    os.makedirs(os.path.dirname(os.path.abspath(flag)), exist_ok=True)
    write_atomic(flag, json.dumps(current, sort_keys=True))
    return current


class Poll:
    """One read of every source; in --follow mode the same object polls again, remembering what it last reported."""

    def __init__(self, args):
        self.args = args
        self.webhook = os.environ.get("XID_WEBHOOK_URL", "").strip()
        self.host = socket.gethostname()
        self.last_errors = None
        self.last_resend = 0.0

    def run(self, follow=False):
        args, now = self.args, int(time.time())
        # Read every poll: an operator (or a test) may have changed it between polls.
        state = load_json(args.state, {})
        texts, errors = [], []
        if not args.no_journal:
            text, state["cursor"], error = read_journal(state.get("cursor"))
            texts.append(text)
            errors += [error] if error else []
        offsets = state.setdefault("offsets", {})
        for path in args.log_file:
            text, offsets[path], error = read_file(path, int(offsets.get(path, 0)))
            texts.append(text)
            errors += [error] if error else []

        events = parse_xid_events("\n".join(texts), ignore=args.ignore)
        critical = [e for e in events if e["code"] in args.drain_code]
        drained = load_json(args.drain_flag, None) if args.drain_flag else None
        if critical and args.drain_flag:
            # First: the host leaves rotation before anything below can take time (the webhook may wait 10 s).
            drained = drain(args.drain_flag, drained, self.host, critical, now)
            print("<2>xid-monitor: this host's vLLM servers are out of rotation (%s); after fixing the GPU, put the host "
                  "back with playbooks/gpu_return.yml -l %s" % (
                      ", ".join("Xid %d on GPU %s" % (e["code"], e["pci_bus_id"] or "(unknown bus id)") for e in critical),
                      self.host))
        counts, last_seen = state.setdefault("counts", {}), state.setdefault("last_seen", {})
        for event in events:
            print("<%d>Xid %d on GPU %s severity=%s: %s (log: %s)" % (
                PRIORITY.get(event["severity"], 4), event["code"], event["pci_bus_id"] or "(unknown bus id)",
                event["severity"], event["description"], event["message"][:200]))
            counts[event["severity"]] = counts.get(event["severity"], 0) + 1
            last_seen["%d|%s|%s" % (event["code"], event["pci_bus_id"] or "unknown", event["severity"])] = now
        if events:
            os.makedirs(os.path.dirname(args.event_log), exist_ok=True)
            with open(args.event_log, "a") as handle:
                for event in events:
                    handle.write(json.dumps(dict(event, host=self.host), sort_keys=True) + "\n")
                # On disk before the journal position moves past them (write_atomic below).
                handle.flush()
                os.fsync(handle.fileno())
        elif not errors and not follow:
            print("<7>xid-monitor: no new Xid events")
        spooled = len(load_json(args.spool, [])) if self.webhook else 0
        if self.webhook and (events or (spooled and (not follow or time.monotonic() - self.last_resend >= RESEND_EVERY_S))):
            self.last_resend = time.monotonic()
            spooled = deliver(self.webhook, args.spool, webhook_payload(self.host, events) if events else None)
        # Followed, a source that stays unreadable is told once (the textfile says it at every poll).
        if errors != self.last_errors:
            for error in errors:
                print("<3>xid-monitor: cannot read the kernel log: %s" % error)
            if not errors and self.last_errors:
                print("<5>xid-monitor: every kernel log source is readable again")
        self.last_errors = errors
        if not errors:
            state["last_success"] = now
        save_dir = os.path.dirname(args.state)
        if save_dir:
            os.makedirs(save_dir, exist_ok=True)
        write_atomic(args.state, json.dumps(state))
        if args.textfile:
            # The flag a return set aside still counts (GpuFaultDrained fires on) until the host is back in rotation.
            set_aside = load_json(returning_path(args.drain_flag), None) if args.drain_flag else None
            write_atomic(args.textfile, metrics_text(state, not errors, spooled, now, (drained, set_aside)))
        sys.stdout.flush()
        return not errors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", default="/var/lib/onprem-vllm/xid-monitor.json")
    parser.add_argument("--event-log", default="/var/log/onprem-vllm/xid-events.log")
    parser.add_argument("--spool", default="/var/lib/onprem-vllm/xid-webhook-spool.json")
    parser.add_argument("--textfile", default="", help="node_exporter textfile (.prom) to write the result to")
    parser.add_argument("--log-file", action="append", default=[])
    parser.add_argument("--ignore", action="append", type=int, default=[])
    parser.add_argument("--no-journal", action="store_true", help="do not read the kernel journal")
    parser.add_argument("--drain-flag", default="", help="the flag a --drain-code event writes (the host leaves rotation)")
    parser.add_argument("--drain-code", action="append", type=int, default=[], help="an Xid code that drains the host")
    parser.add_argument("--follow", type=float, default=0, help="poll every SECONDS instead of reading once")
    args = parser.parse_args(argv)
    poll = Poll(args)
    if args.follow <= 0:
        return 0 if poll.run() else 1
    while True:
        poll.run(follow=True)
        time.sleep(args.follow)


if __name__ == "__main__":
    sys.exit(main())
