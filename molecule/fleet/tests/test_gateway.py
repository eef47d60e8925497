# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's gateway after the side effect: it keeps its secrets and serves every host again."""
from __future__ import annotations

testinfra_hosts = ["ansible://vllm_gateways"]


def _stat(host):
    cmd = ("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
           "s.connect('/run/onprem-gateway/admin.sock'); s.sendall(b'show stat\\n'); print(s.makefile().read())\"")
    return host.check_output(cmd)


def test_gateway_files_are_readable_by_haproxy_only(host):
    """Root owns the configuration; HAProxy (group 99, upstream's image user) reads it; nobody else can."""
    for path in ("/etc/onprem-gateway/haproxy.cfg", "/etc/onprem-gateway/clients.map"):
        f = host.file(path)
        assert (f.user, f.gid, f.mode) == ("root", 99, 0o640), path
    d = host.file("/etc/onprem-gateway")
    assert (d.user, d.gid, d.mode) == ("root", 99, 0o750)


def test_gateway_serves_every_host_again(host):
    rows = [line for line in _stat(host).splitlines() if line.startswith("vllm,fleet-ws")]
    assert len(rows) == 3
    assert all(",UP," in row for row in rows), rows


def test_backend_key_not_in_process_args_or_container_config(host):
    cfg = host.file("/etc/onprem-gateway/haproxy.cfg").content_string
    key = cfg.split('Authorization "Bearer ', 1)[1].split('"', 1)[0]
    assert len(key) >= 8
    assert key not in host.check_output("ps auxww")
    assert key not in host.check_output("docker inspect onprem-gateway")
    assert key not in host.check_output("docker logs onprem-gateway 2>&1")


def test_gateway_refuses_unknown_clients(host):
    code = host.check_output(
        "python3 -c \"import urllib.request, urllib.error\n"
        "try:\n urllib.request.urlopen('http://127.0.0.1:4000/v1/models', timeout=10); print(200)\n"
        "except urllib.error.HTTPError as e: print(e.code)\"")
    assert code.strip() == "401"
