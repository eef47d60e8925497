# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Mutual TLS from the gateway to its servers (gateway_backend_tls), with the real parts: the role's haproxy.cfg
rendered by ansible-playbook, the lab's HAProxy running it, and stand-in servers in the serving image that speak TLS
as vLLM does with --ssl-cert-reqs 2 (a certificate of their own, only the gateway's client certificate trusted).

Two servers of one deployment: `pinned` presents the certificate the gateway pins for it; `impostor` sits at the
address of the other server, whose certificate the gateway pins, but presents its own. The gateway serves through
the pinned one only, the impostor never comes up; and directly, a server answers the gateway's certificate only.
"""
from __future__ import annotations

import json
import os
import sys
import uuid

import pytest

from test_gateway_routing import RENDER as ROUTING_RENDER
from test_gateway_routing import GATEWAY_IMAGE, SERVING_IMAGE, _docker, _gateway_log, _render

pytestmark = [pytest.mark.needs_docker, pytest.mark.needs_lab_share]

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SERVER_KEY, CLIENT_KEY = "server-key-0123456789abcdef", "client-key-0123456789abcdef"

# The routing test's rendering (configuration, maps, error answers, hold, model lists), then the pinned certificates
# as the role's host_files call writes them.
RENDER = ROUTING_RENDER + """
    # (_gateway_haproxy_files holds them, but its other entries are role templates this play cannot look up.)
    - name: Write each server's pinned certificate
      ansible.builtin.copy:
        content: "{{ hostvars[item].vllm_server_tls_certificate }}"
        dest: "{{ _gateway_backend_tls_dir }}/server-{{ item }}.crt"
        mode: "0644"
      loop: "{{ _gateway_backend_servers }}"

    - name: Say what the usage service is told of the servers
      ansible.builtin.debug:
        var: _gateway_usage_settings.servers
"""

# As vLLM with --ssl-certfile/--ssl-keyfile/--ssl-ca-certs/--ssl-cert-reqs 2: a connection without a trusted client
# certificate never reaches HTTP. Each answer names the server and the client certificate's common name.
STAND_IN = r'''
import http.server, json, ssl, sys

NAME, CERT, KEY, CLIENTS = sys.argv[1:5]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def peer(self):
        return dict(x[0] for x in self.connection.getpeercert()["subject"])["commonName"]

    def do_GET(self):
        self.send({"server": NAME, "client": self.peer()})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send({"id": "chat-1", "object": "chat.completion", "created": 0, "model": "tiny-chat",
                   "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": NAME}}],
                   "server": NAME, "client": self.peer()})


context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
context.verify_mode = ssl.CERT_REQUIRED
context.load_verify_locations(CLIENTS)
httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler)
httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
'''

# From another container of the network: the gateway's answers, then each server asked directly with the gateway's
# certificate, with a stranger's and with none.
CLIENT = r'''
import json, os, ssl, sys, urllib.request

gateway, pinned, certs = sys.argv[1:4]
out = {"through_gateway": []}
for _ in range(4):
    req = urllib.request.Request("http://%s:4000/v1/chat/completions" % gateway, method="POST",
                                 data=json.dumps({"model": "tiny-chat", "messages": []}).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["CLIENT_KEY"],
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            out["through_gateway"].append(json.load(answer)["server"])
    except urllib.error.HTTPError as exc:
        out["through_gateway"].append(exc.code)


def direct(cert):
    context = ssl.create_default_context(cafile=certs + "/pinned.crt")
    context.check_hostname = False
    if cert:
        context.load_cert_chain(certs + "/%s.crt" % cert, certs + "/%s.key" % cert)
    try:
        with urllib.request.urlopen("https://%s:8000/health" % pinned, context=context, timeout=10) as answer:
            return json.load(answer)["client"]
    except Exception as exc:  # the refusal, whatever form the handshake's failure takes
        return "refused: %s" % type(exc).__name__


out["direct"] = {who: direct(who) for who in ("gateway", "stranger", None)}
print(json.dumps(out))
'''


STATUS_ASK = r'''
import json, urllib.error, urllib.request
out = {}
for name, server in (("pinned", "vllm-chat/chat1"), ("impostor", "vllm-chat/chat2"), ("unknown", "vllm-chat/nobody")):
    req = urllib.request.Request("http://127.0.0.1:8499/onprem/drain", headers={"X-Onprem-Status": server})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            out[name] = [answer.status, json.load(answer)]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, None]
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    for image in (GATEWAY_IMAGE, SERVING_IMAGE):
        if _docker("image", "inspect", image, check=False).returncode:
            pytest.fail("the lab's image %s is missing: run make lab-artifacts" % image)
    import conftest

    tmp = tmp_path_factory.mktemp("gateway-backend-tls")
    prefix = "onprem-gwtls-" + uuid.uuid4().hex[:8]
    certs, config, state, runtime = tmp / "certs", tmp / "config", tmp / "state", tmp / "runtime"
    for folder in (certs, config, config / "backends", state, runtime):
        folder.mkdir()
    runtime.chmod(0o777)
    names = {"pinned": prefix + "-pinned", "impostor": prefix + "-impostor"}
    made = {who: conftest.make_certificate(certs, who, usage, names=[names.get(who, who)])
            for who, usage in (("pinned", "server"), ("other", "server"), ("impostor", "server"),
                               ("gateway", "client"), ("stranger", "client"))}
    pem = {who: open(cert).read() for who, (cert, _key) in made.items()}
    # The gateway's identity as tasks/tls_identity.yml leaves it: the certificate, and its key beside it (.key).
    (config / "backends" / "client.pem").write_text(pem["gateway"])
    (config / "backends" / "client.pem.key").write_text(open(made["gateway"][1]).read())
    common = {"ansible_connection": "local", "ansible_python_interpreter": os.path.abspath(sys.executable)}
    inventory = {"all": {
        "vars": {"onprem_vllm_deployments": [{"name": "chat", "served_model_name": "tiny-chat", "hosts": "vllm_chat",
                                              "port": 8000}],
                 "onprem_vllm_served_model_name": "unused", "onprem_vllm_api_key": SERVER_KEY,
                 "onprem_vllm_server_tls": True, **common},
        "children": {
            "vllm_servers": {"children": {"vllm_chat": {"hosts": {
                # The impostor's host: the gateway pins the certificate of the server that should be there.
                "chat1": {"onprem_vllm_advertise_host": names["pinned"], "vllm_server_tls_certificate": pem["pinned"]},
                "chat2": {"onprem_vllm_advertise_host": names["impostor"],
                          "vllm_server_tls_certificate": pem["other"]}}}}},
            "vllm_gateways": {"hosts": {"gw": {
                "out": str(config), "templates": os.path.join(ROOT, "roles", "gateway", "templates"),
                "gateway_image_tag": GATEWAY_IMAGE.split(":", 1)[1], "gateway_port": 4000,
                "gateway_config_dir": str(config), "gateway_runtime_dir": str(runtime),
                "gateway_state_dir": str(state), "gateway_health_check_interval": "500ms",
                "gateway_tls_client_certificate": pem["gateway"],
                "gateway_client_keys": [{"name": "full", "key": CLIENT_KEY}]}}}}}}
    tasks = _render(tmp, inventory, RENDER, STAND_IN, CLIENT)
    usage_servers = tasks["Say what the usage service is told of the servers"]["gw"]["_gateway_usage_settings.servers"]
    (state / "over-budget.lst").write_text("")
    for path in [tmp, *tmp.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o644)
    network = prefix + "-net"
    containers = [prefix + "-" + name for name in ("pinned", "impostor", "gw", "client")]
    try:
        _docker("network", "create", network)
        for who in ("pinned", "impostor"):
            _docker("run", "-d", "--name", names[who], "--network", network, "-v", "%s:/test:ro" % tmp,
                    "--entrypoint", "python3", SERVING_IMAGE, "/test/stand_in.py", who,
                    "/test/certs/%s.crt" % who, "/test/certs/%s.key" % who, "/test/certs/gateway.crt")
        _docker("run", "-d", "--name", prefix + "-gw", "--network", network,
                "-v", "%s:/usr/local/etc/haproxy:ro" % config, "-v", "%s:/run/haproxy-admin" % runtime,
                "-v", "%s:/var/lib/haproxy-state:ro" % state, GATEWAY_IMAGE)
        # Until the pinned server is UP (checks every 500 ms, rise 2 by default).
        client = None
        for _attempt in range(20):
            client = _docker("run", "--rm", "--name", prefix + "-client", "--network", network,
                             "-v", "%s:/test:ro" % tmp, "-e", "CLIENT_KEY=" + CLIENT_KEY, "--entrypoint", "python3",
                             SERVING_IMAGE, "/test/client.py", prefix + "-gw", names["pinned"], "/test/certs",
                             check=False)
            if client.returncode == 0 and "pinned" in json.loads(client.stdout)["through_gateway"]:
                break
        assert client.returncode == 0, (client.stderr[-3000:], _gateway_log(prefix + "-gw")[-3000:])
        # The hold's Lua asks a DOWN server its drain status through the gateway's loopback listener (its HTTP
        # client has no client certificate): from inside the gateway's network namespace, as the Lua does.
        status = _docker("run", "--rm", "--network", "container:%s-gw" % prefix, "--entrypoint", "python3",
                         SERVING_IMAGE, "-c", STATUS_ASK, check=False)
        yield {"client": json.loads(client.stdout), "config": (config / "haproxy.cfg").read_text(),
               "status": json.loads(status.stdout or "{}"),
               "usage_servers": usage_servers, "log": _gateway_log(prefix + "-gw"),
               "pinned_files": sorted(p.name for p in (config / "backends").iterdir())}
    finally:
        for container in containers:
            _docker("rm", "-f", container, check=False)
        _docker("network", "rm", network, check=False)


def test_the_gateway_serves_through_the_pinned_server_only(outcome):
    # The impostor never comes up: every request reaches the server whose certificate the gateway pins.
    assert outcome["client"]["through_gateway"] == ["pinned"] * 4, outcome["log"][-2000:]


def test_each_server_line_pins_its_own_certificate_and_presents_the_gateways(outcome):
    # Each server twice: in its backend, and in the drain status listener (named <deployment>-<host> there); the
    # model finder on the gateway host's own socket.
    servers = [line.split() for line in outcome["config"].splitlines() if line.strip().startswith("server ")]
    assert sorted(line[1] for line in servers) == ["chat-chat1", "chat-chat2", "chat1", "chat2", "finder"]
    servers = [line for line in servers if line[1] != "finder"]
    for line in servers:
        assert line[3:] == ["ssl", "verify", "required", "ca-file",
                            "/usr/local/etc/haproxy/backends/server-%s.crt" % line[1].split("-")[-1],
                            "crt", "/usr/local/etc/haproxy/backends/client.pem"]
    assert outcome["pinned_files"] == ["client.pem", "client.pem.key", "server-chat1.crt", "server-chat2.crt"]


def test_a_server_answers_the_gateways_certificate_only(outcome):
    direct = outcome["client"]["direct"]
    assert direct["gateway"].endswith("gateway") or direct["gateway"] == "gateway"
    assert direct["stranger"].startswith("refused") and direct["null"].startswith("refused")


def test_the_usage_service_asks_each_server_over_mutual_tls(outcome):
    for server in outcome["usage_servers"]:
        assert server["url"].startswith("https://")
        assert server["tls"]["cert"].endswith("/backends/client.pem")
        assert server["tls"]["ca"].endswith("/backends/server-%s.crt" % server["name"].split("/")[1])


def test_the_holds_drain_status_question_reaches_the_named_server_over_mutual_tls(outcome):
    # The pinned server answers (it saw the gateway's certificate); the impostor is not asked into trusting a
    # certificate that is not pinned (503, as a server that answers nothing), and an unknown name is no server (404).
    assert outcome["status"]["pinned"] == [200, {"server": "pinned", "client": "gateway"}]
    assert outcome["status"]["impostor"][0] == 503 and outcome["status"]["unknown"][0] == 404
