# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU fault flag's states and its return, decided without I/O (the modules gpu_fault_flag_info and gpu_fault_flag
read and act; the Xid monitor, which writes the flag, imports returning_path).

The flag (the Xid monitor's JSON: host, since, events with the time each was seen) takes the host out of rotation: the
servers' middleware fails /health while it exists. playbooks/gpu_return.yml sets it aside as `<flag>.returning`, which
the middleware does not read, so the gates reach the servers; the set-aside file is removed only once every server of
the host passed its gates and is back in rotation, and put back as the flag if one fails. Until then it counts as the
flag everywhere else: a rollout refuses the host, the monitor's drained metric keeps it, a later return picks it up.

read() and apply() are the only I/O: each write is whole (a temporary file renamed over the old one, then the folder
synced), so a power cut leaves the old file or the new one. Standard library only: the monitoring role installs this
file next to the Xid monitor.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile

RETURNING_SUFFIX = ".returning"

# The states gpu_fault_flag takes the files to.
STATES = ("returning", "present", "absent")


def returning_path(flag):
    """Where a return keeps the flag set aside until the host is back in rotation."""
    return flag + RETURNING_SUFFIX


def format_time(seconds):
    """ISO 8601 in UTC, to the second, of seconds since the epoch."""
    return datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc).isoformat()


def parse_content(text):
    """The flag's JSON as a dict; None when it is not one (a truncated or hand-written file still flags the host)."""
    try:
        content = json.loads(text)
    except ValueError:
        return None
    return content if isinstance(content, dict) else None


def _events(content):
    events = (content or {}).get("events")
    return [event for event in events if isinstance(event, dict)] if isinstance(events, list) else []


def fault_time(content, mtime):
    """When the fault was flagged (seconds since the epoch): the latest time the monitor saw one of its events (it
    extends the flag with each new one), else its `since`, else the file's mtime (content unreadable)."""
    times = [event["seen"] for event in _events(content) if isinstance(event.get("seen"), (int, float))]
    if times:
        return max(times)
    since = (content or {}).get("since")
    return since if isinstance(since, (int, float)) and not isinstance(since, bool) else mtime


def merge(*contents):
    """One flag's content from several (the flag and the set-aside file): every event once, oldest first by when it
    was seen; `since` the earliest; the first host named."""
    present = [content for content in contents if content is not None]
    events, seen = [], set()
    for content in present:
        for event in _events(content):
            key = json.dumps(event, sort_keys=True)
            if key not in seen:
                seen.add(key)
                events.append(event)
    events.sort(key=lambda event: event.get("seen") if isinstance(event.get("seen"), (int, float)) else 0)
    merged = {"events": events}
    sinces = [c["since"] for c in present if isinstance(c.get("since"), (int, float)) and not isinstance(c["since"], bool)]
    if sinces:
        merged["since"] = min(sinces)
    hosts = [c["host"] for c in present if c.get("host")]
    if hosts:
        merged["host"] = hosts[0]
    return merged


def view(flag, returning):
    """What the host's files say. flag, returning: None when the file is absent, else {"content": dict or None,
    "mtime": seconds}. Returns flagged (the flag itself: /health fails), returning (set aside by a return that has not
    finished), fault (either), the events of both, and fault_time (None without a fault)."""
    files = [f for f in (flag, returning) if f is not None]
    return {
        "flagged": flag is not None,
        "returning": returning is not None,
        "fault": bool(files),
        "events": merge(*[f["content"] for f in files])["events"],
        "fault_time": max(fault_time(f["content"], f["mtime"]) for f in files) if files else None,
    }


def transition(state, flag, returning, now, host, checked_after=None):
    """The steps that take the host's files to `state`, in order, or an error (nothing to do then).

    flag, returning: as in view(). Steps: ("rename", src, dst), ("write", name, content), ("remove", name), with
    names "flag" and "returning"; each write is whole and atomic, each step leaves a state this function takes on
    from (a kill between two steps is undone by the next call).
      - returning: the flag set aside. A fault flagged after `checked_after` (the time after which this run's GPU
        preflight counted Xids) is refused: that Xid was not checked.
      - present: the flag back (a return that failed a gate): the set-aside file renamed, merged into a flag the
        monitor wrote meanwhile, or, when both are gone, a flag without events (the host stays out all the same).
      - absent: the set-aside file removed (the host is back in rotation). Refused while the flag exists: the monitor
        flagged the host again during the return, and it stays out.
    """
    if state not in STATES:
        raise ValueError("unknown state %r" % (state,))
    if state == "returning":
        if flag is None and returning is None:
            return [], "no GPU fault flag: the host is not out of rotation after a GPU fault, there is nothing to return"
        if checked_after is not None:
            flagged = view(flag, returning)
            if int(flagged["fault_time"]) > int(checked_after):
                return [], ("a critical Xid flagged the host again at %s, after this run's GPU preflight counted Xids "
                            "(those logged after %s); nothing changed: fix the GPU, then run the return again"
                            % (format_time(flagged["fault_time"]), format_time(checked_after)))
        if flag is None:
            return [], None
        if returning is None:
            return [("rename", "flag", "returning")], None
        return [("write", "returning", merge(returning["content"], flag["content"])), ("remove", "flag")], None
    if state == "present":
        if returning is None:
            if flag is None:
                return [("write", "flag", {"host": host, "since": now, "events": []})], None
            return [], None
        if flag is None:
            return [("rename", "returning", "flag")], None
        return [("write", "flag", merge(returning["content"], flag["content"])), ("remove", "returning")], None
    if flag is not None:
        xids = ", ".join("Xid %s on GPU %s" % (e.get("code"), e.get("pci_bus_id") or "(unknown bus id)")
                         for e in _events(flag["content"]))
        return [], ("a critical Xid flagged the host again during its return (%s): it stays out of rotation; fix the "
                    "GPU, then run the return again" % (xids or "the flag is back"))
    return ([("remove", "returning")] if returning is not None else []), None


def _read_one(path):
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
            mtime = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None
    return {"content": parse_content(text), "mtime": mtime}


def read(flag):
    """(flag, returning) of the host, as view() and transition() take them. A file that exists but cannot be read
    raises OSError: it is not taken for an absent flag."""
    return _read_one(flag), _read_one(returning_path(flag))


def _sync_folder(path):
    handle = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def apply(steps, flag):
    """Carries out transition()'s steps on the host's files."""
    paths = {"flag": flag, "returning": returning_path(flag)}
    for step in steps:
        if step[0] == "rename":
            os.rename(paths[step[1]], paths[step[2]])
        elif step[0] == "write":
            path = paths[step[1]]
            handle, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".gpu-fault-")
            try:
                with os.fdopen(handle, "w") as out:
                    out.write(json.dumps(step[2], sort_keys=True))
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:
            os.unlink(paths[step[1]])
        _sync_folder(flag)
