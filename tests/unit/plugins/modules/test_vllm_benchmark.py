# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_benchmark module through the ansible CLI: a real sweep against a local fake server, and bad input."""
from __future__ import annotations

import json
import os

import pytest


@pytest.fixture
def run(run_module):
    def bench(args, check=False, env=None):
        return run_module("vllm_benchmark", args, env=env, check=check, timeout=180)
    return bench


@pytest.fixture
def server(fake_vllm):
    return fake_vllm(tokens=4)


def target(url, key="test-key-123456789", name="ws1"):
    return {"name": name, "url": url, "api_key": key, "model": "m", "meta": {"vllm_version": "v0.32.0"}}


def test_sweep_writes_every_file_and_the_baseline_gate_fails(server, tmp_path, run):
    out = run({"targets": [target(server.url)], "concurrency": [1, 2], "num_requests": 4, "max_tokens": 4,
               "results_dir": str(tmp_path / "r1"), "baseline_dir": str(tmp_path / "base"), "save_baseline": True,
               "progress": False})
    assert not out.get("failed"), out.get("msg")
    names = sorted(os.listdir(tmp_path / "r1"))
    assert names == ["progress.log", "report.html", "summary.json", "throughput.png", "ttft_p99.png", "ws1.csv",
                     "ws1.json"]
    assert os.path.exists(tmp_path / "base" / "ws1.json") and not out["partial"]
    assert (tmp_path / "r1" / "throughput.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (tmp_path / "r1" / "report.html").read_text()
    assert page.count("<svg") == 2 and "id=\"throughput-host-ws1\"" in page and "<img" not in page
    # An impossible baseline: the same server now "regresses".
    base = json.loads((tmp_path / "base" / "ws1.json").read_text())
    for level in base["levels"]:
        level["output_throughput"] *= 100
    (tmp_path / "base" / "ws1.json").write_text(json.dumps(base))
    out = run({"targets": [target(server.url)], "concurrency": [1, 2], "num_requests": 4, "max_tokens": 4,
               "results_dir": str(tmp_path / "r2"), "baseline_dir": str(tmp_path / "base"), "progress": False})
    assert out["failed"] and "REGRESSION" in out["msg"] and "output throughput dropped" in out["msg"]
    assert os.path.exists(tmp_path / "r2" / "report.html")


def test_concurrency_zero_is_refused_before_any_load(tmp_path, run):
    out = run({"targets": [target("http://127.0.0.1:9/v1")], "concurrency": [1, 0], "results_dir": str(tmp_path)})
    assert out["failed"] and "concurrency level 0 is not allowed" in out["msg"]
    assert os.listdir(tmp_path) == []


def test_wrong_key_fails_clearly_and_writes_partial_results(server, tmp_path, run):
    out = run({"targets": [target(server.url, key="wrong")], "concurrency": [1], "num_requests": 2,
               "results_dir": str(tmp_path), "progress": False})
    assert out["failed"] and "PARTIAL" in out["msg"] and "HTTP 401" in out["msg"] and "API key" in out["msg"]
    record = json.loads((tmp_path / "ws1.json").read_text())
    assert record["partial"] is True
    assert "PARTIAL RESULTS" in (tmp_path / "report.html").read_text()


def test_unreachable_host_fails_clearly_other_hosts_still_measured(server, tmp_path, run):
    out = run({"targets": [target("http://127.0.0.1:9/v1", name="down"), target(server.url)], "concurrency": [1],
               "num_requests": 2, "request_timeout": 5, "results_dir": str(tmp_path), "progress": False})
    assert out["failed"] and "down:" in out["msg"] and ("cannot reach" in out["msg"] or "timed out" in out["msg"])
    hosts = {h["name"]: h for h in out["hosts"]}
    assert hosts["down"]["partial"] and not hosts["ws1"]["partial"] and hosts["ws1"]["levels"][0]["successful"] == 2


def test_without_matplotlib_it_says_what_to_install_before_any_load_unless_charts_are_off(run, server, tmp_path):
    # A matplotlib that cannot be imported, first on the module's path: a Python without the package.
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib (test)')\n")
    args = {"targets": [target(server.url)], "concurrency": [1], "num_requests": 2, "max_tokens": 4,
            "progress": False}
    out = run(dict(args, results_dir=str(tmp_path / "r")), env={"PYTHONPATH": str(tmp_path / "site")})
    assert out["failed"] and "Failed to import the required Python library (matplotlib)" in out["msg"]
    assert not os.path.exists(tmp_path / "r") and server.connections == 0
    # The rollout's benchmark gate (on the GPU host): no charts, no matplotlib needed, every other file.
    out = run(dict(args, results_dir=str(tmp_path / "gate"), charts=False), env={"PYTHONPATH": str(tmp_path / "site")})
    assert not out.get("failed"), out.get("msg")
    files = ["progress.log", "report.html", "summary.json", "ws1.csv", "ws1.json"]
    assert sorted(os.listdir(tmp_path / "gate")) == files
    page = (tmp_path / "gate" / "report.html").read_text()
    assert "<svg" not in page and "charts=false" in page and out["hosts"][0]["levels"][0]["successful"] == 2


def test_check_mode_sends_nothing_and_writes_nothing_then_each_run_rewrites_the_same_files(run, server, tmp_path):
    args = {"targets": [target(server.url, server.key)], "concurrency": [1], "num_requests": 2, "max_tokens": 4,
            "results_dir": str(tmp_path / "r"), "progress": False}
    check = run(args, check=True)
    assert check["changed"] is False and not check.get("failed") and "would send 2 requests to each of ws1" in check["msg"]
    assert not os.path.exists(tmp_path / "r") and server.bodies == []
    first = run(args)
    names = sorted(os.listdir(tmp_path / "r"))
    assert first["changed"] is True and not first.get("failed"), first.get("msg")
    assert len(server.bodies) == 2 + 1  # the requests and one warm-up
    # A benchmark is a new measurement each time (changed), into the same set of files: nothing piles up.
    again = run(args)
    assert again["changed"] is True and not again.get("failed") and sorted(os.listdir(tmp_path / "r")) == names
