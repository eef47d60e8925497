# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""benchmarks/tls_forward.py: a plain loopback door to a server that speaks only mutual TLS, with the host's local
identity (the test's trusted client), against a real TLS server (conftest's vllm_endpoints_tls)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_a_plain_client_reaches_the_tls_server_through_the_door(vllm_endpoints_tls, tmp_path, free_port):
    srv = vllm_endpoints_tls
    # The identities under the names the door reads (a host's tls folder).
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    shutil.copy(srv.server_cert, tls_dir / "server.crt")
    shutil.copy(srv.client[0], tls_dir / "local.crt")
    shutil.copy(srv.client[1], tls_dir / "local.key")
    port = free_port()
    door = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "tls_forward.py"), "--listen",
                             "127.0.0.1:%d" % port, "--to", srv.url.split("//")[1], "--tls-dir", str(tls_dir)])
    try:
        for _attempt in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.05)
        request = urllib.request.Request("http://127.0.0.1:%d/v1/models" % port,
                                         headers={"Authorization": "Bearer " + srv.key})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200 and b'"q"' in answer.read()
        assert srv.seen == [("GET", "/v1/models", "Bearer " + srv.key)]
    finally:
        door.kill()
        door.wait()


def test_the_door_opens_on_loopback_only(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tls_forward.py"), "--listen",
                           "0.0.0.0:18000", "--to", "127.0.0.1:8000", "--tls-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "loopback" in done.stderr
