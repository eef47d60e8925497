# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Take this host's vLLM servers out of the gateways' rotation before it shuts down (onprem-vllm-drain.service's
ExecStop; standard library only, run by the host's python3).

Writes the drain flag, which the servers' middleware (onprem_vllm_auth.py) turns into 503 on /health, so the
gateways' health checks stop sending new requests. Then waits at least --min-wait seconds (the gateways' checks need
that long to see it) and until the servers report no request running or waiting (their open /metrics), at most
--timeout seconds. Only then does the shutdown go on to stop the servers: no request is cut. `systemctl start
onprem-vllm-drain` removes the flag (the service's ExecStart), and /run is empty after a boot anyway.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.request

IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def in_flight(metrics_text: str) -> float:
    """Requests running or waiting in one server's Prometheus text (0 when it exports neither)."""
    return sum(float(value) for value in IN_FLIGHT.findall(metrics_text))


def read_in_flight(url: str) -> float | None:
    """None when the server does not answer (stopped, or not started yet): nothing to wait for there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return in_flight(resp.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None


def drain(flag: str, urls: list[str], min_wait: float, timeout: float, poll: float = 0.5,
          clock=time.monotonic, sleep=time.sleep, read=read_in_flight) -> tuple[float, list]:
    """Write the flag, then wait; returns (seconds waited, the last in-flight counts)."""
    os.makedirs(os.path.dirname(flag), exist_ok=True)
    with open(flag, "w") as handle:
        handle.write("draining\n")
    started = clock()
    while True:
        counts = [read(url) for url in urls]
        waited = clock() - started
        if waited >= timeout or (waited >= min_wait and not any(counts)):
            return waited, counts
        sleep(poll)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flag", required=True, help="the drain flag the servers' middleware reads")
    parser.add_argument("--metrics", action="append", default=[], help="a server's /metrics URL (repeatable)")
    parser.add_argument("--min-wait", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    waited, counts = drain(args.flag, args.metrics, args.min_wait, args.timeout)
    print(f"onprem-vllm-drain: out of rotation after {waited:.1f} s; requests still running or waiting: {counts}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
