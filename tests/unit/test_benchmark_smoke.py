# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark scripts that need no lab, run once each as their make targets run them (short), so that they cannot
rot: `make bench-gpu` (gpu_modules_speed.py on the recorded H200 outputs) and `make bench-kv` (kv_accuracy.py on the
cited vLLM logs and the committed H200 startups; the vllm-wizard column only where that tool is installed). Their
figures are not judged here (docs/measurements.md has them); only that they run, cover their cases and report no
failure. The lab's benchmarks run in the fleet scenario: benchmark.yml (bench-report), rollout_bench.yml
(bench-rollout), gateway_tenancy.yml (bench-gateway), and bench_smoke.yml (bench-kv-fleet, bench-compare,
bench-calibrate, bench-deploy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(*argv):
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)


def test_bench_gpu_times_both_modules_on_the_recorded_h200(tmp_path):
    out = tmp_path / "gpu.json"
    proc = run("benchmarks/gpu_modules_speed.py", "--repeat", "1", "--no-ansible", "--no-live", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert {(r["module"], r["status"]) for r in rows if r["source"].startswith("fixture")} == {
        ("gpu_topology_info", "ok"), ("gpu_health_info", "ok")}
    assert all(r["process_s"] > 0 for r in rows)


def test_bench_kv_checks_every_cited_log_without_a_wrong_verdict(tmp_path):
    proc = run("benchmarks/kv_accuracy.py", "--wizard-python", str(tmp_path / "no-wizard" / "python"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    # Deterministic: the planner on committed logs (the cited ones, then the H200 families).
    assert proc.stdout.count("wrong verdicts: 0") == 3, proc.stdout[-2000:]
    assert "concurrency from the logged available memory exact: 16/16" in proc.stdout
