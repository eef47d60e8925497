# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Xid monitor as systemd runs it: the installed pair of files (monitor + gpu_health_info's parser) in one folder,
run as a process. journalctl is a stand-in on PATH (the test host's journal is not the point); the webhook is a real
local HTTP server."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
XID_79 = "Nov 29 09:00:00 ws1 kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_REDACTED = "Nov 29 09:00:01 ws1 kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 01"
# What the monitoring role installs next to the monitor, from plugins/module_utils (roles/monitoring/vars/main.yml, _monitoring_xid_code).
MONITOR_LIB = ("gpu_health_checks.py", "gpu_fault_flag.py")


@pytest.fixture
def monitor(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(os.path.join(ROOT, "roles", "monitoring", "files", "xid_monitor.py"), lib)
    for name in MONITOR_LIB:
        shutil.copy(os.path.join(ROOT, "plugins", "module_utils", name), lib)
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def journalctl(script):
        path = bindir / "journalctl"
        path.write_text("#!/bin/sh\n" + script + "\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)

    def run(*extra, webhook="", search_path=None):
        path = str(bindir) if search_path == "stand-in only" else "%s:%s" % (bindir, os.environ["PATH"])
        env = dict(os.environ, PATH=path, XID_WEBHOOK_URL=webhook)
        argv = [sys.executable, str(lib / "xid_monitor.py"), "--state", str(tmp_path / "state.json"),
                "--event-log", str(tmp_path / "events.log"), "--spool", str(tmp_path / "spool.json"),
                "--textfile", str(tmp_path / "xid.prom"), "--log-file", str(tmp_path / "kern.log")] + list(extra)
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60)

    journalctl("echo '-- cursor: s=1'")
    return run, journalctl, tmp_path


class Sink(http.server.BaseHTTPRequestHandler):
    received = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        Sink.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def sink():
    Sink.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d/xid" % server.server_address[1], Sink.received
    server.shutdown()


def metrics(tmp_path):
    out = {}
    for line in (tmp_path / "xid.prom").read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_journal_that_cannot_be_read_fails_the_run_and_keeps_the_cursor(monitor):
    run, journalctl, tmp_path = monitor
    assert run().returncode == 0
    assert json.loads((tmp_path / "state.json").read_text())["cursor"] == "s=1"
    journalctl("echo 'Failed to open journal: Permission denied' >&2; exit 1")
    (tmp_path / "kern.log").write_text(XID_79 + "\n")
    proc = run()
    assert proc.returncode == 1
    assert "<3>xid-monitor: cannot read the kernel log: journalctl -k failed (exit 1): Failed to open journal" in proc.stdout
    assert "Xid 79 on GPU 0000:01:00.0 severity=block" in proc.stdout  # the readable file still counts
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["cursor"] == "s=1"
    m = metrics(tmp_path)
    assert m["onprem_vllm_xid_monitor_last_run_success"] == 0
    assert m["onprem_vllm_xid_monitor_last_success_timestamp_seconds"] < m["onprem_vllm_xid_monitor_last_run_timestamp_seconds"] + 1
    journalctl("echo '-- cursor: s=2'")
    assert run().returncode == 0
    assert metrics(tmp_path)["onprem_vllm_xid_monitor_last_run_success"] == 1


def test_no_new_kernel_lines_is_not_a_failure(monitor):
    run, journalctl, tmp_path = monitor
    assert run().returncode == 0
    # What systemd 252 (Debian 12) prints and returns when nothing follows the cursor (seen on a lab host).
    journalctl("echo '-- No entries --'; exit 1")
    proc = run()
    assert proc.returncode == 0, proc.stdout
    assert json.loads((tmp_path / "state.json").read_text())["cursor"] == "s=1"
    assert metrics(tmp_path)["onprem_vllm_xid_monitor_last_run_success"] == 1


def test_journalctl_that_cannot_run_fails_the_run(monitor):
    run, tmp_path = monitor[0], monitor[2]
    os.remove(tmp_path / "bin" / "journalctl")
    proc = run(search_path="stand-in only")  # no journalctl on PATH at all
    assert proc.returncode == 1 and "journalctl could not run" in proc.stdout, proc.stdout + proc.stderr


def test_metrics_count_events_and_label_the_code(monitor):
    run, tmp_path = monitor[0], monitor[2]
    (tmp_path / "kern.log").write_text(XID_79 + "\n" + XID_REDACTED + "\n")
    assert run().returncode == 0
    m = metrics(tmp_path)
    assert m['onprem_vllm_xid_events_total{xid_severity="block"}'] == 1
    assert m['onprem_vllm_xid_events_total{xid_severity="warn"}'] == 1
    assert m['onprem_vllm_xid_events_total{xid_severity="info"}'] == 0
    assert 'onprem_vllm_xid_last_event_timestamp_seconds{code="79",pci_bus_id="0000:01:00.0",xid_severity="block"}' in m
    assert 'onprem_vllm_xid_last_event_timestamp_seconds{code="145",pci_bus_id="unknown",xid_severity="warn"}' in m
    assert run().returncode == 0  # nothing new: counts stay
    assert metrics(tmp_path)['onprem_vllm_xid_events_total{xid_severity="block"}'] == 1


XID_13 = "Nov 29 09:00:02 ws1 kernel: NVRM: Xid (PCI:0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)"
DRAIN = ("--drain-code", "79", "--drain-code", "48")


def test_a_critical_xid_writes_the_drain_flag_and_a_warning_does_not(monitor):
    run, tmp_path = monitor[0], monitor[2]
    flag = tmp_path / "fault" / "xid.json"
    (tmp_path / "kern.log").write_text(XID_13 + "\n")
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    assert not flag.exists()
    assert not [name for name in metrics(tmp_path) if name.startswith("onprem_vllm_xid_drained")]
    with open(tmp_path / "kern.log", "a") as handle:
        handle.write(XID_79 + "\n")
    proc = run("--drain-flag", str(flag), *DRAIN)
    assert proc.returncode == 0
    assert "<2>xid-monitor: this host's vLLM servers are out of rotation (Xid 79 on GPU 0000:01:00.0)" in proc.stdout
    drained = json.loads(flag.read_text())
    assert [(e["code"], e["pci_bus_id"]) for e in drained["events"]] == [(79, "0000:01:00.0")]
    assert metrics(tmp_path)['onprem_vllm_xid_drained{code="79",pci_bus_id="0000:01:00.0"}'] == 1
    # The flag stays (only gpu_return.yml removes it) and the next critical event is added to it.
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    assert metrics(tmp_path)['onprem_vllm_xid_drained{code="79",pci_bus_id="0000:01:00.0"}'] == 1
    with open(tmp_path / "kern.log", "a") as handle:
        handle.write(XID_79.replace("79, pid", "48, pid") + "\n")
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    later = json.loads(flag.read_text())
    assert later["since"] == drained["since"] and [e["code"] for e in later["events"]] == [79, 48]
    flag.unlink()  # the operator's return
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    assert not [name for name in metrics(tmp_path) if name.startswith("onprem_vllm_xid_drained")]


def test_a_flag_set_aside_by_a_return_stays_drained_and_a_new_xid_flags_the_host_again(monitor):
    """A return sets the flag aside (<flag>.returning) while it gates the servers: GpuFaultDrained keeps firing until
    the host is back, and a critical Xid meanwhile writes the flag again, with the new event alone."""
    run, tmp_path = monitor[0], monitor[2]
    flag = tmp_path / "xid.json"
    (tmp_path / "kern.log").write_text(XID_79 + "\n")
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    flag.rename(str(flag) + ".returning")
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    assert not flag.exists()
    assert metrics(tmp_path)['onprem_vllm_xid_drained{code="79",pci_bus_id="0000:01:00.0"}'] == 1
    with open(tmp_path / "kern.log", "a") as handle:
        handle.write(XID_79.replace("79, pid", "48, pid") + "\n")
    assert run("--drain-flag", str(flag), *DRAIN).returncode == 0
    assert [e["code"] for e in json.loads(flag.read_text())["events"]] == [48]
    m = metrics(tmp_path)
    assert m['onprem_vllm_xid_drained{code="79",pci_bus_id="0000:01:00.0"}'] == 1
    assert m['onprem_vllm_xid_drained{code="48",pci_bus_id="0000:01:00.0"}'] == 1


def test_an_ignored_code_never_drains(monitor):
    run, tmp_path = monitor[0], monitor[2]
    flag = tmp_path / "xid.json"
    (tmp_path / "kern.log").write_text(XID_79 + "\n")
    assert run("--drain-flag", str(flag), "--ignore", "79", *DRAIN).returncode == 0
    assert not flag.exists()


def test_followed_it_drains_within_its_poll_and_keeps_running_when_a_source_fails(monitor):
    run, journalctl, tmp_path = monitor
    flag = tmp_path / "xid.json"
    lib = tmp_path / "lib" / "xid_monitor.py"
    env = dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"]), XID_WEBHOOK_URL="")
    argv = [sys.executable, str(lib), "--state", str(tmp_path / "state.json"), "--event-log", str(tmp_path / "ev.log"),
            "--spool", str(tmp_path / "spool.json"), "--textfile", str(tmp_path / "xid.prom"),
            "--log-file", str(tmp_path / "kern.log"), "--drain-flag", str(flag), *DRAIN, "--follow", "0.1"]
    follower = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        def wait_for(check):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if check():
                    return True
                time.sleep(0.1)
            return False
        assert wait_for((tmp_path / "xid.prom").exists)
        journalctl("echo 'Failed to open journal: Permission denied' >&2; exit 1")
        assert wait_for(lambda: metrics(tmp_path).get("onprem_vllm_xid_monitor_last_run_success") == 0)
        (tmp_path / "kern.log").write_text(XID_79 + "\n")  # the readable file still drains
        assert wait_for(flag.exists)
        journalctl("echo '-- cursor: s=2'")
        assert wait_for(lambda: metrics(tmp_path).get("onprem_vllm_xid_monitor_last_run_success") == 1)
        assert follower.poll() is None
    finally:
        follower.kill()
    out = follower.communicate()[0]
    assert out.count("cannot read the kernel log") == 1, out  # told once, not at every poll
    assert "every kernel log source is readable again" in out


def test_a_failed_webhook_post_is_sent_again_by_the_next_run(monitor, sink):
    run, tmp_path = monitor[0], monitor[2]
    url, received = sink
    (tmp_path / "kern.log").write_text(XID_79 + "\n")
    proc = run(webhook="http://127.0.0.1:9/unreachable")
    assert proc.returncode == 0 and "webhook failed, 1 alert(s) kept for the next run" in proc.stdout
    assert metrics(tmp_path)["onprem_vllm_xid_webhook_spooled"] == 1
    with open(tmp_path / "kern.log", "a") as handle:
        handle.write(XID_REDACTED + "\n")
    assert run(webhook=url).returncode == 0
    assert [[e["code"] for e in r["events"]] for r in received] == [[79], [145]]  # oldest first
    assert received[1]["text"].endswith("Xid 145 (warn) on GPU (unknown bus id): " + received[1]["events"][0]["description"])
    assert json.loads((tmp_path / "spool.json").read_text()) == []
    assert metrics(tmp_path)["onprem_vllm_xid_webhook_spooled"] == 0
    assert run(webhook=url).returncode == 0
    assert len(received) == 2  # nothing sent twice


def load_monitor(tmp_path):
    """The monitor as a module (its folder on sys.path for what it imports), for the write path's order."""
    import importlib.util
    lib = tmp_path / "lib-import"
    lib.mkdir()
    shutil.copy(os.path.join(ROOT, "roles", "monitoring", "files", "xid_monitor.py"), lib)
    for name in MONITOR_LIB:
        shutil.copy(os.path.join(ROOT, "plugins", "module_utils", name), lib)
    sys.path.insert(0, str(lib))
    try:
        spec = importlib.util.spec_from_file_location("xid_monitor_under_test", lib / "xid_monitor.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(lib))
    return module


def test_the_journal_position_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """A power cut must not lose the position (nor leave an empty state file): the new state is fsync'd before the
    rename, the folder after it. Killed between the write and the rename, the old position is whole."""
    xid = load_monitor(tmp_path)
    state = tmp_path / "state.json"
    state.write_text('{"cursor": "s=old"}')
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(xid.os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(xid.os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    xid.write_atomic(str(state), '{"cursor": "s=new"}')
    assert calls == ["fsync", "replace", "fsync"] and json.loads(state.read_text()) == {"cursor": "s=new"}

    def killed(src, dst):
        raise KeyboardInterrupt("killed between the write and the rename")

    monkeypatch.setattr(xid.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        xid.write_atomic(str(state), '{"cursor": "s=newer"}')
    assert json.loads(state.read_text()) == {"cursor": "s=new"}
    assert json.loads((tmp_path / "state.json.tmp").read_text()) == {"cursor": "s=newer"}  # whole, never renamed
