# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's gateway after the side effect: it keeps its secrets and serves every host again."""
from __future__ import annotations

# By container name: the inventory's ansible_host is the host's lab address (lab_overlay.yml), which testinfra's
# docker backend would take for the container.
testinfra_hosts = ["docker://fleet-gw"]


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
    rows = [line for line in _stat(host).splitlines() if line.startswith("vllm-chat,fleet-ws")]
    assert len(rows) == 3
    assert all(",UP," in row for row in rows), rows


def test_backend_key_not_in_process_args_or_container_config(host):
    cfg = host.file("/etc/onprem-gateway/haproxy.cfg").content_string
    key = cfg.split('Authorization "Bearer ', 1)[1].split('"', 1)[0]
    assert len(key) >= 8
    assert key not in host.check_output("ps auxww")
    assert key not in host.check_output("docker inspect onprem-gateway")
    assert key not in host.check_output("docker logs onprem-gateway 2>&1")


def test_gateway_refuses_unknown_clients_over_tls(host):
    """The example's gateway speaks HTTPS (its certificate verified at the lab address) and wants a client key."""
    code = host.check_output(
        "python3 -c \"import ssl, urllib.request, urllib.error\n"
        "ctx = ssl.create_default_context(cafile='/etc/onprem-gateway/tls-ca.pem')\n"
        "try:\n urllib.request.urlopen('https://172.30.97.5:4000/v1/models', timeout=10, context=ctx); print(200)\n"
        "except urllib.error.HTTPError as e: print(e.code)\"")
    assert code.strip() == "401"


def test_drain_state_and_admin_socket_survive_a_reboot(host):
    """The server-state file HAProxy loads at start (drains survive reloads and restarts), and the tmpfiles.d entry
    that makes the admin socket's folder again at boot, owned by HAProxy's user."""
    state = host.file("/var/lib/onprem-gateway/servers.state")
    assert (state.user, state.gid, state.mode) == ("root", 99, 0o640)
    assert state.content_string.startswith("1\n# be_id ")
    assert "d /run/onprem-gateway 0700 99 99 -" in host.file("/etc/tmpfiles.d/onprem-gateway.conf").content_string
