# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Docker API helpers: sizes, durations, log frames, the create body and its digest."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import docker_api

SPEC = {"image": "vllm/vllm-openai:v0.32.0", "command": ["--model", "m"], "env": {"B": "2", "A": "1"},
        "bind_address": "0.0.0.0", "port": 8001, "container_port": 8000, "volumes": ["/srv/hf:/root/.cache/hf:ro"],
        "ipc_host": False, "shm_size": "16g", "gpu_uuids": ["GPU-1", "GPU-2"],
        "healthcheck": {"test": ["CMD", "true"], "interval": "15s", "timeout": "15s", "retries": 3,
                        "start_period": "900s"},
        "restart_policy": "unless-stopped", "log_options": {"max-size": "50m", "max-file": 5},
        "served_model_name": "qwen3"}


@pytest.mark.parametrize("text,expected", [("16g", 16 * 1024 ** 3), ("512m", 512 * 1024 ** 2), ("1024", 1024),
                                           ("2GB", 2 * 1024 ** 3), ("1.5k", 1536)])
def test_sizes_in_dockers_notation(text, expected):
    assert docker_api.size_bytes(text) == expected


@pytest.mark.parametrize("text,expected", [("15s", 15e9), ("10m", 600e9), ("1m30s", 90e9), ("900", 900e9),
                                           ("500ms", 5e8)])
def test_durations(text, expected):
    assert docker_api.duration_ns(text) == int(expected)


@pytest.mark.parametrize("bad", ["fast", "15x", "1m30", ""])
def test_a_duration_that_is_none_is_refused(bad):
    with pytest.raises(ValueError):
        docker_api.duration_ns(bad)


def _frame(stream, data):
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def test_log_frames_are_joined_in_order():
    frame = _frame
    assert docker_api.demultiplex(frame(1, b"one\n") + frame(2, b"two\n")) == "one\ntwo"
    assert docker_api.demultiplex(b"plain text from a TTY\n") == "plain text from a TTY"


def test_the_create_body():
    body = docker_api.create_body(SPEC, {"onprem.vllm.deployment": "abc"})
    host = body["HostConfig"]
    assert body["Env"] == ["A=1", "B=2"] and body["Cmd"] == ["--model", "m"]
    assert host["PortBindings"] == {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8001"}]}
    assert host["ShmSize"] == 16 * 1024 ** 3 and "IpcMode" not in host and host["Init"] is True
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "Count": 0, "DeviceIDs": ["GPU-1", "GPU-2"],
                                       "Capabilities": [["gpu"]]}]
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "50m", "max-file": "5"}}
    assert body["Healthcheck"]["StartPeriod"] == 900 * 10 ** 9
    cpu = docker_api.create_body(dict(SPEC, gpu_uuids=[], ipc_host=True), {})
    assert "DeviceRequests" not in cpu["HostConfig"] and cpu["HostConfig"]["IpcMode"] == "host"


def test_the_digest_follows_every_part_of_the_container_but_not_its_labels():
    digest = docker_api.spec_digest(SPEC)
    assert docker_api.spec_digest(dict(SPEC)) == digest
    for key, value in (("restart_policy", "always"), ("volumes", []), ("shm_size", "8g"),
                       ("env", {"A": "1"}), ("healthcheck", dict(SPEC["healthcheck"], interval="30s"))):
        assert docker_api.spec_digest(dict(SPEC, **{key: value})) != digest, key


@pytest.mark.parametrize("test,argv", [(["CMD", "bash", "-c", "exit 0"], ["bash", "-c", "exit 0"]),
                                       (["CMD-SHELL", "curl -f localhost"], ["/bin/sh", "-c", "curl -f localhost"]),
                                       (["NONE"], None), (None, None), ([], None)])
def test_a_health_check_as_the_command_exec_runs(test, argv):
    assert docker_api.healthcheck_argv(test) == argv


def test_exec_runs_the_command_and_returns_its_exit_code_and_output(tmp_path):
    import http.server
    import json
    import socketserver
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status, payload, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            if self.path == "/containers/vllm/exec":
                self._answer(201, b'{"Id": "e1"}')
            else:
                self._answer(200, _frame(1, b"ok\n") + _frame(2, b"warn\n"), "application/vnd.docker.raw-stream")

        def do_GET(self):  # noqa: N802
            seen.append((self.path, None))
            self._answer(200, b'{"ExitCode": 3, "Running": false}')

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            return super().get_request()[0], ("local", 0)

    path = str(tmp_path / "docker.sock")
    with Server(path, Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        code, output = docker_api.Docker(path, timeout=5).exec_run("vllm", ["bash", "-c", "true"], timeout=5)
        server.shutdown()
    assert (code, output) == (3, "ok\nwarn")
    assert seen == [("/containers/vllm/exec", {"Cmd": ["bash", "-c", "true"], "AttachStdout": True,
                                               "AttachStderr": True}),
                    ("/exec/e1/start", {"Detach": False, "Tty": False}), ("/exec/e1/json", None)]
