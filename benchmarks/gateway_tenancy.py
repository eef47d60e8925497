# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two clients through the fleet gateway, and the gateway's own cost (benchmarks/gateway_tenancy.yml runs it).

  python3 benchmarks/gateway_tenancy.py --gateway https://172.30.97.5:4000 --cafile CERT --model NAME \
      --quiet-key-file F1 --noisy-key-file F2 --server http://172.30.97.11:8000 --server-key-file F3 --out result.json

Three phases, the same requests (chat completions, --max-tokens tokens) throughout:
  1. the quiet client alone (one request at a time, --quiet-interval between): its latency;
  2. the quiet client again while the noisy one sends --noisy-concurrency requests at once in a tight loop: the noisy one
     must get 429 (its gateway limits) and the quiet one nothing but answers; its latency against phase 1 is reported
     beside the stated bound (--quiet-p99-bound: p99 at most that many times phase 1's);
  3. one request at a time, alternately straight to one server and through the gateway (--overhead-requests each):
     the gateway's added latency, p50 and p99, in the same run. Each urllib request opens its own connection, so the
     gateway's figure includes its TLS handshake.
Exit 1 when the limits did not hold (the noisy client never got 429, or the quiet one got anything but answers); the
latency bound is reported, not enforced (a 2-core lab's CPU servers are no latency reference). Standard library only;
loopback and private addresses only (prober.py's rule).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prober import ProbeError, Prober, check_target, percentile  # noqa: E402  pylint: disable=wrong-import-position


def prober(url: str, key: str, args, concurrency: int, interval: float, seconds: float, max_requests: int = 100000,
           cafile: str | None = None, cert: str | None = None, cert_key: str | None = None) -> Prober:
    return Prober(argparse.Namespace(url=url, cafile=cafile, cert=cert, cert_key=cert_key, model=args.model,
                                     endpoint="chat", max_tokens=args.max_tokens, max_requests=max_requests,
                                     max_seconds=seconds, concurrency=concurrency, interval=interval,
                                     request_timeout=120, stop_file=None), key)


def summary(result: dict, latencies: list[float]) -> dict:
    return {"requests": result["requests"], "ok": result["ok"], "statuses": result["statuses"],
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99)}


def overhead(args, keys: dict) -> dict:
    direct = prober(args.server, keys["server"], args, 1, 0, 3600, cafile=args.server_cafile, cert=args.server_cert,
                    cert_key=args.server_cert_key)
    gateway = prober(args.gateway, keys["quiet"], args, 1, 0, 3600, cafile=args.cafile)
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    failures = []
    for _round in range(args.overhead_requests):
        for name, client in (("direct", direct), ("gateway", gateway)):
            began = time.monotonic()
            status, _backend, error = client.one_request()
            if status == 200 and not error:
                times[name].append(time.monotonic() - began)
            else:
                failures.append({"via": name, "status": status, "error": error[:120]})
    out = {name: {"p50_s": percentile(values, 50), "p99_s": percentile(values, 99), "n": len(values)}
           for name, values in times.items()}
    for pct in ("p50", "p99"):
        if out["direct"][pct + "_s"] is not None and out["gateway"][pct + "_s"] is not None:
            out["added_" + pct + "_ms"] = round((out["gateway"][pct + "_s"] - out["direct"][pct + "_s"]) * 1000, 1)
    out["failures"] = failures
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", required=True, help="the gateway's base URL")
    parser.add_argument("--cafile", help="the certificate an https gateway is verified against")
    parser.add_argument("--model", required=True, help="a served model name both clients may use")
    parser.add_argument("--quiet-key-file", type=Path, required=True)
    parser.add_argument("--noisy-key-file", type=Path, required=True, help="a client whose gateway limits it exceeds")
    parser.add_argument("--server", required=True, help="one server's base URL, for the gateway's added latency")
    parser.add_argument("--server-key-file", type=Path, required=True)
    parser.add_argument("--server-cafile", help="a server over mutual TLS: its certificate (the gateway pins it)")
    parser.add_argument("--server-cert", help="a server over mutual TLS: the client certificate it trusts (the gateway's)")
    parser.add_argument("--server-cert-key", help="the private key of --server-cert")
    parser.add_argument("--seconds", type=float, default=30, help="length of phases 1 and 2")
    parser.add_argument("--quiet-interval", type=float, default=0.2)
    parser.add_argument("--noisy-concurrency", type=int, default=12)
    parser.add_argument("--noisy-interval", type=float, default=0.05, help="the noisy workers' pause (a tight loop)")
    parser.add_argument("--overhead-requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--quiet-p99-bound", type=float, default=3.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        for url in (args.gateway, args.server):
            check_target(url)
        keys = {name: path.read_text().strip() for name, path in
                (("quiet", args.quiet_key_file), ("noisy", args.noisy_key_file), ("server", args.server_key_file))}
    except (ProbeError, OSError) as exc:
        print(f"gateway_tenancy: {exc}", file=sys.stderr)
        return 2

    alone = prober(args.gateway, keys["quiet"], args, 1, args.quiet_interval, args.seconds, cafile=args.cafile)
    alone_result = alone.run()
    quiet = prober(args.gateway, keys["quiet"], args, 1, args.quiet_interval, args.seconds, cafile=args.cafile)
    noisy = prober(args.gateway, keys["noisy"], args, args.noisy_concurrency, args.noisy_interval, args.seconds,
                   cafile=args.cafile)
    results: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda name=name, p=p: results.__setitem__(name, p.run()))
               for name, p in (("quiet", quiet), ("noisy", noisy))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = {
        "quiet_alone": summary(alone_result, alone.latencies),
        "quiet_with_noisy": summary(results["quiet"], quiet.latencies),
        "noisy": summary(results["noisy"], noisy.latencies),
        "overhead": overhead(args, keys),
        "quiet_p99_bound": args.quiet_p99_bound,
    }
    alone_p99, loaded_p99 = report["quiet_alone"]["p99_s"], report["quiet_with_noisy"]["p99_s"]
    report["quiet_p99_ratio"] = round(loaded_p99 / alone_p99, 2) if alone_p99 and loaded_p99 else None
    report["limited"] = report["noisy"]["statuses"].get("429", 0) > 0
    report["quiet_unharmed"] = (results["quiet"]["failed"] == 0 and alone_result["failed"] == 0
                                and results["quiet"]["ok"] > 0)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    over = report["overhead"]
    print(f"noisy client: {report['noisy']['requests']} requests, statuses {report['noisy']['statuses']}")
    print(f"quiet client: alone p50 {report['quiet_alone']['p50_s']} s p99 {alone_p99} s; beside the noisy one "
          f"p50 {report['quiet_with_noisy']['p50_s']} s p99 {loaded_p99} s, statuses "
          f"{report['quiet_with_noisy']['statuses']}; p99 ratio {report['quiet_p99_ratio']} "
          f"({'within' if report['quiet_p99_ratio'] is not None and report['quiet_p99_ratio'] <= args.quiet_p99_bound else 'over'}"
          f" the stated bound of {args.quiet_p99_bound}x)")
    print(f"gateway overhead ({over['direct']['n']} + {over['gateway']['n']} requests, alternating): direct p50 "
          f"{over['direct']['p50_s']} s p99 {over['direct']['p99_s']} s, gateway p50 {over['gateway']['p50_s']} s "
          f"p99 {over['gateway']['p99_s']} s: added p50 {over.get('added_p50_ms')} ms, p99 {over.get('added_p99_ms')} ms")
    return 0 if report["limited"] and report["quiet_unharmed"] and not over["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
