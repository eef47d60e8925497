# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HAProxy's runtime API (the admin stats socket), as pure functions plus one small socket client.

The gateway puts every vLLM host in one HAProxy backend; a rollout takes a host out of rotation with
`set server B/S state drain` (no new requests; requests already running finish), waits until the server's current
sessions (`scur`) and queue (`qcur`) are zero, then `state maint` (health checks stop too, so stopping vLLM logs no
error). Undrain goes MAINT -> DRAIN, forces the server's health DOWN, then `state ready`: leaving MAINT straight to
ready, HAProxy reports the health the server had before (UP at once, no new check), so the host counts as back only
once HAProxy has run `rise` fresh passing checks after the undrain and says UP again.

Runtime states live in HAProxy's memory only: a reload or restart would put a drained host back in rotation. So every
change is followed by `show servers state` written to the server-state file that HAProxy loads when it starts
(`server-state-file`, `load-server-state-from-file global`).
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import socket
import tempfile
import time

STATES = ("ready", "drain", "maint")


class RuntimeError_(Exception):
    """A runtime API problem the caller reports as is (socket missing, unknown server, command refused)."""


def parse_stat(text: str) -> list[dict]:
    """Rows of `show stat` (CSV whose header line starts with '# ')."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise RuntimeError_(f"unexpected `show stat` output: {text[:200]!r}")
    header = lines[0][2:]
    reader = csv.DictReader(io.StringIO("\n".join([header] + lines[1:])))
    return [{key: value for key, value in row.items() if key} for row in reader]


def find_server(rows: list[dict], backend: str, server: str) -> dict:
    for row in rows:
        if row.get("pxname") == backend and row.get("svname") == server:
            return row
    known = sorted(f"{row['pxname']}/{row['svname']}" for row in rows
                   if row.get("svname") not in ("FRONTEND", "BACKEND") and row.get("pxname") == backend)
    raise RuntimeError_(f"server {backend}/{server} is not in the gateway's configuration (known in {backend}: "
                        f"{', '.join(known) or 'none'}): run the gateway role so its configuration lists every host")


def as_int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def in_flight(row: dict) -> int:
    """Requests the server is still busy with or that wait for it: current sessions plus its queue."""
    return as_int(row.get("scur")) + as_int(row.get("qcur"))


def admin_state(status: str) -> str:
    """HAProxy's status column (UP, DOWN, UP 1/2, DRAIN, MAINT, MAINT (via x/y), no check, ...) as ready/drain/maint."""
    upper = (status or "").upper()
    if upper.startswith("MAINT"):
        return "maint"
    if upper.startswith("DRAIN") or upper == "NOLB":
        return "drain"
    return "ready"


def is_serving(status: str) -> bool:
    """In rotation and passing its health check: UP (not 'UP 1/2', which is on its way down), or no check at all."""
    return (status or "").upper() in ("UP", "NO CHECK")


def others_serving(rows: list[dict], backend: str, server: str) -> bool:
    """Whether another server of the backend is in rotation and passing its checks (it takes the requests)."""
    return any(row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND", server)
               and is_serving(row.get("status", "")) for row in rows)


def hold_command(backend: str, seconds: int) -> str:
    """Hold the backend's requests at the gateway while none of its servers is UP (roles/gateway, onprem_hold.lua)."""
    return f"onprem hold {backend} {int(seconds)}"


def release_command(backend: str) -> str:
    return f"onprem release {backend}"


def parse_hold_answer(text: str) -> dict | None:
    """The gateway's answer to `onprem hold` or `onprem release`: the hold's counts (backend, remaining_ms, waiting,
    held, longest_ms), or None where there was no hold to release or the gateway has no hold (a configuration written
    before it: HAProxy answers "Unknown command")."""
    line = (text or "").strip()
    if not line.startswith("{"):
        if "unknown command" in line.lower():
            return None
        raise RuntimeError_(f"unexpected answer to a hold command: {line[:200]!r}")
    try:
        answer = json.loads(line)
    except ValueError as exc:
        raise RuntimeError_(f"unexpected answer to a hold command: {line[:200]!r}") from exc
    return None if answer.get("not_held") else answer


def commands_for(current_status: str, state: str, backend: str, server: str, fresh_check: bool = True) -> list[str]:
    """The runtime commands that take a server from its current status to the wanted state (empty: nothing to do).

    With fresh_check, a server put back in rotation is first forced DOWN (still out of rotation), so it serves again
    only once HAProxy's own checks pass after the undrain; never for a server already in rotation.
    """
    if state not in STATES:
        raise RuntimeError_(f"state must be one of {', '.join(STATES)}, got {state!r}")
    current = admin_state(current_status)
    target = f"{backend}/{server}"
    if state == current:
        return []
    if state == "maint" and current == "ready":
        # Drain first: maint alone would also let running requests finish, but drain makes the wait explicit.
        return [f"set server {target} state drain", f"set server {target} state maint"]
    if state == "ready" and fresh_check:
        # `health down` is ignored in MAINT (measured on 2.6.12: it came back "UP 1/2", in rotation, without a new
        # check), so MAINT goes to DRAIN first (checked, still out of rotation), then DOWN, then ready: DOWN until
        # `rise` fresh checks pass.
        return ([f"set server {target} state drain"] if current == "maint" else []) + [
            f"set server {target} health down", f"set server {target} state ready"]
    return [f"set server {target} state {state}"]


def wait_for(fetch, done, timeout: float, poll_interval: float, clock=time.monotonic, sleep=time.sleep):
    """Call fetch() until done(row) or the timeout; returns (row, seconds waited, finished)."""
    started = clock()
    row = fetch()
    while not done(row):
        if clock() - started >= timeout:
            return row, clock() - started, False
        sleep(poll_interval)
        row = fetch()
    return row, clock() - started, True


class RuntimeSocket:
    """One command per connection on HAProxy's admin socket (non-interactive mode)."""

    def __init__(self, path: str, timeout: float = 10.0):
        self.path = path
        self.timeout = timeout

    def command(self, cmd: str) -> str:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
            sock.sendall(cmd.encode() + b"\n")
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except OSError as exc:
            raise RuntimeError_(f"HAProxy admin socket {self.path}: {exc} (is the gateway container running?)") from exc
        finally:
            sock.close()
        return b"".join(chunks).decode(errors="replace")

    def set_command(self, cmd: str) -> None:
        answer = self.command(cmd).strip()
        # Success prints nothing (or a note); errors name the problem.
        if answer and any(word in answer.lower() for word in ("unknown", "no such", "require", "invalid", "denied")):
            raise RuntimeError_(f"`{cmd}` refused by HAProxy: {answer}")

    def stat_rows(self) -> list[dict]:
        return parse_stat(self.command("show stat"))

    def server_state(self) -> str:
        return check_server_state(self.command("show servers state"))


def check_server_state(text: str) -> str:
    """`show servers state` output as HAProxy's server-state-file wants it: a format version line, then the rows."""
    if not text.startswith("1\n") or "\n# be_id " not in text:
        raise RuntimeError_(f"unexpected `show servers state` output: {text[:200]!r}")
    return text if text.endswith("\n") else text + "\n"


def write_server_state(path: str, text: str) -> None:
    """Replace HAProxy's server-state file with `text`, atomically and durably (a power cut leaves the old file or the
    new one, never a torn one): a temporary file beside it, fsync, rename, fsync of the folder. The file is 0640 and
    takes the folder's group, which HAProxy's user reads through."""
    folder = os.path.dirname(path) or "."
    group = os.stat(folder).st_gid
    fd, tmp = tempfile.mkstemp(prefix=".servers.state.", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(check_server_state(text))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o640)
        if os.geteuid() == 0:
            os.chown(tmp, 0, group)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_server_state(path: str, read_state) -> None:
    """Write what `read_state()` returns (HAProxy's `show servers state`) to the server-state file, read and written
    under an exclusive lock beside it: two drains at once (two deployments of a host, two rollouts) each read the
    states after their own command, so the last writer holds every change and no drain is lost at the next reload."""
    lock_fd = os.open(os.path.join(os.path.dirname(path) or ".", ".servers.state.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        write_server_state(path, read_state())
    finally:
        os.close(lock_fd)
