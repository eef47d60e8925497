# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Take this host's vLLM servers out of the gateways' rotation before it shuts down (onprem-vllm-drain.service's
ExecStop; standard library only, run by the host's python3).

Writes the drain flag, which the servers' middleware (onprem_vllm_auth.py) turns into 503 on /health. Then waits, at
most --timeout seconds, until every server is out: each gateway whose health checks reached it (before the drain too:
the middleware remembers every gateway that checks it with the key) has had as many checks refused as it needs to stop
sending (its `fall`, which its checks state) or has stopped checking for --min-wait seconds (the server is in
maintenance there, or the gateway is gone), and the server answers no request. Servers report both on GET
/onprem/drain. The wait is at least --min-wait seconds (longer than the gateways' check interval), and the servers must
be out on two polls in a row (a request the gateway sent just before its verdict has arrived by then). A server whose
status cannot be read (a timeout: busy, not stopped) is not out; one that refuses the connection has stopped.
Only then does the shutdown go on to stop the servers: no request is cut. `systemctl start onprem-vllm-drain`
removes the flag (the service's ExecStart), and /run is empty after a boot anyway.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

STATUS_PATH = "/onprem/drain"


# A status that could not be read although the server is there (it timed out): not out, ask again.
UNREADABLE = {"unreadable": True}


def read_status(server: str, context: ssl.SSLContext | None = None) -> dict | None:
    """A server's drain status; None when nothing listens (stopped, or not started yet): nothing to wait for there.
    A server whose middleware predates the status (an error answer) reports nothing: only --min-wait holds for it."""
    try:
        with urllib.request.urlopen(server.rstrip("/") + STATUS_PATH, timeout=5, context=context) as resp:
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError:
        return {}
    except urllib.error.URLError as exc:
        return None if isinstance(exc.reason, ConnectionRefusedError) else dict(UNREADABLE)
    except ConnectionRefusedError:
        return None
    except (OSError, ValueError):
        return dict(UNREADABLE)


def is_out(status: dict | None, min_wait: float) -> bool:
    """No gateway sends this server requests any more and it answers none. A gateway that stopped checking before its
    verdict (the server was set to maintenance there, or the gateway went away) for longer than min_wait sends none
    either."""
    if status is None:
        return True
    if status.get("unreadable"):
        return False
    checks = status.get("checks", {}).values()
    return status.get("in_flight", 0) == 0 and all(
        check["refused"] >= check["fall"] or check.get("idle_s", 0) >= min_wait for check in checks)


def drain(flag: str, servers: list[str], min_wait: float, timeout: float, poll: float = 0.5,
          clock=time.monotonic, sleep=time.sleep, read=read_status) -> tuple[float, list]:
    """Write the flag, then wait; returns (seconds waited, the last statuses)."""
    os.makedirs(os.path.dirname(flag), exist_ok=True)
    with open(flag, "w") as handle:
        handle.write("draining\n")
    started, out_before = clock(), False
    while True:
        statuses = [read(server) for server in servers]
        out = all(is_out(status, min_wait) for status in statuses)
        waited = clock() - started
        if waited >= timeout or (waited >= min_wait and out and out_before):
            return waited, statuses
        out_before = out
        sleep(poll)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flag", required=True, help="the drain flag the servers' middleware reads")
    parser.add_argument("--server", action="append", default=[],
                        help="a server's base URL on this host, e.g. http://127.0.0.1:8000 (repeatable)")
    parser.add_argument("--min-wait", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--ca", default="", help="https servers: their certificate, the only one trusted")
    parser.add_argument("--cert", default="", help="https servers: the client certificate this host presents")
    parser.add_argument("--key", default="", help="the private key of --cert")
    args = parser.parse_args(argv)
    context = None
    if args.ca:
        context = ssl.create_default_context(cafile=args.ca)
        if args.cert:
            context.load_cert_chain(args.cert, args.key or None)
    waited, statuses = drain(args.flag, args.server, args.min_wait, args.timeout,
                             read=functools.partial(read_status, context=context))
    # One JSON line in the journal: what each server reported last (the fleet scenario reads it after a reboot).
    print("onprem-vllm-drain: " + json.dumps({"waited_s": round(waited, 1), "timeout": waited >= args.timeout,
                                              "servers": dict(zip(args.server, statuses))}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
