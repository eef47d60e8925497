# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Docker Engine API over its unix socket, for the few calls a server's deployment makes, and the container a
deployment describes as the API's create body.

Standard library only (hosts need no Docker SDK). A container's environment travels in the request body, never in a
process argument.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
from urllib.parse import quote, urlencode

SOCKET = "/var/run/docker.sock"
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


class DockerError(Exception):
    """An answer of the Docker daemon other than the one asked for (its message included)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        # 1 MiB blocks: an image archive of several GB is sent from its file.
        super().__init__("localhost", timeout=timeout, blocksize=1024 * 1024)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Docker:
    def __init__(self, path=SOCKET, timeout=600):
        self.path = path
        self.timeout = timeout

    def call(self, method, url, body=None, ok=(200, 201, 204, 304), raw=False, headers=None):
        conn = _UnixConnection(self.path, self.timeout)
        try:
            data = json.dumps(body).encode() if body is not None and not hasattr(body, "read") else body
            sent = {"Content-Type": "application/json"} if body is not None else {}
            sent.update(headers or {})
            conn.request(method, url, body=data, headers=sent)
            resp = conn.getresponse()
            payload = resp.read()
        except OSError as exc:
            raise DockerError(0, "cannot reach the Docker daemon at %s: %s" % (self.path, exc)) from None
        finally:
            conn.close()
        if resp.status not in ok:
            try:
                message = json.loads(payload).get("message", "")
            except ValueError:
                message = payload.decode("utf-8", "replace")
            raise DockerError(resp.status, "%s %s: %s %s" % (method, url.split("?")[0], resp.status, message.strip()))
        if raw:
            return payload
        return json.loads(payload) if payload.strip() else None

    def inspect(self, name):
        """The container's inspect object, or None when there is none of that name."""
        try:
            return self.call("GET", "/containers/%s/json" % quote(name))
        except DockerError as exc:
            if exc.status == 404:
                return None
            raise

    def image(self, reference):
        try:
            return self.call("GET", "/images/%s/json" % quote(reference, safe=""))
        except DockerError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, name, body):
        return self.call("POST", "/containers/create?" + urlencode({"name": name}), body)["Id"]

    def start(self, name):
        self.call("POST", "/containers/%s/start" % quote(name))

    def stop(self, name, seconds):
        self.call("POST", "/containers/%s/stop?t=%d" % (quote(name), seconds))

    def rename(self, name, new_name):
        self.call("POST", "/containers/%s/rename?%s" % (quote(name), urlencode({"name": new_name})))

    def remove(self, name):
        try:
            self.call("DELETE", "/containers/%s?force=1&v=1" % quote(name))
        except DockerError as exc:
            if exc.status != 404:
                raise

    def root_dir(self):
        return self.call("GET", "/info")["DockerRootDir"]

    def load(self, archive):
        """Load a `docker save` archive; the image names it held ("repo:tag")."""
        with open(archive, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            payload = self.call("POST", "/images/load?quiet=1", handle, raw=True,
                                headers={"Content-Type": "application/x-tar", "Content-Length": str(size)})
        return [name.strip() for name in re.findall(r"Loaded image: ([^\s]+)", _stream_text(payload))]

    def pull(self, repository, tag):
        """Pull REPOSITORY at TAG (a tag, or a digest sha256:...)."""
        _stream_text(self.call("POST", "/images/create?" + urlencode({"fromImage": repository, "tag": tag}),
                               raw=True))

    def exec_run(self, name, argv, timeout):
        """Run ARGV in the running container NAME: (exit code, its output as text)."""
        exec_id = self.call("POST", "/containers/%s/exec" % quote(name),
                            {"Cmd": argv, "AttachStdout": True, "AttachStderr": True})["Id"]
        runner = Docker(self.path, timeout)
        output = demultiplex(runner.call("POST", "/exec/%s/start" % exec_id, {"Detach": False, "Tty": False}, raw=True))
        return self.call("GET", "/exec/%s/json" % exec_id)["ExitCode"], output

    def logs(self, name, lines):
        """The last LINES lines of the container's output (stdout and stderr), '' when there is none."""
        try:
            payload = self.call("GET", "/containers/%s/logs?stdout=1&stderr=1&tail=%d" % (quote(name), lines), raw=True)
        except DockerError:
            return ""
        return demultiplex(payload)


def _stream_text(payload: bytes) -> str:
    """The text of a JSON-lines progress stream (load, pull); raises DockerError on its error line."""
    texts = []
    for line in payload.decode("utf-8", "replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("error"):
            raise DockerError(500, event["error"])
        texts.append(event.get("stream") or event.get("status") or "")
    return "\n".join(texts)


def demultiplex(payload: bytes) -> str:
    """A log stream of a container without a TTY: frames of an 8-byte header (stream, 0, 0, 0, size) and the data."""
    out, at = [], 0
    while at + 8 <= len(payload) and payload[at] in (0, 1, 2) and payload[at + 1:at + 4] == b"\0\0\0":
        size = int.from_bytes(payload[at + 4:at + 8], "big")
        out.append(payload[at + 8:at + 8 + size])
        at += 8 + size
    if at < len(payload):
        out.append(payload[at:])
    return b"".join(out).decode("utf-8", "replace").strip()


def size_bytes(text) -> int:
    """Docker's size notation (16g, 512m, 1024) in bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", str(text).lower())
    if not found:
        raise ValueError("%r is not a size (a number with an optional b, k, m, g or t)" % (text,))
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def duration_ns(text) -> int:
    """A duration (15s, 10m, 900s, 1m30s, or seconds as a number) in nanoseconds."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text) * 1e9)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError("%r is not a duration (e.g. 15s, 10m, 1m30s)" % (text,))
    return int(sum(float(a) * _SECONDS[b] for a, b in parts) * 1e9)


def healthcheck_argv(test) -> list | None:
    """The command of a container's HEALTHCHECK (Config.Healthcheck.Test) as an exec argv; None when it has none."""
    if not test or test[0] == "NONE":
        return None
    if test[0] == "CMD":
        return list(test[1:])
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", test[1]]
    return list(test)


def create_body(spec: dict, labels: dict) -> dict:
    """The API's create body for SPEC (the module's container option) with LABELS."""
    port = "%d/tcp" % spec["container_port"]
    host = {
        "PortBindings": {port: [{"HostIp": spec["bind_address"], "HostPort": str(spec["port"])}]},
        # tini as PID 1 reaps vLLM's worker processes: without it a stop can hit a zombie.
        "Init": True,
        "Binds": list(spec["volumes"]),
        "RestartPolicy": {"Name": spec["restart_policy"]},
        "LogConfig": {"Type": "json-file", "Config": {k: str(v) for k, v in spec["log_options"].items()}},
    }
    if spec["ipc_host"]:
        host["IpcMode"] = "host"
    else:
        host["ShmSize"] = size_bytes(spec["shm_size"])
    if spec["gpu_uuids"]:
        host["DeviceRequests"] = [{"Driver": "nvidia", "Count": 0, "DeviceIDs": list(spec["gpu_uuids"]),
                                   "Capabilities": [["gpu"]]}]
    check = spec["healthcheck"]
    return {
        "Image": spec["image"],
        "Cmd": list(spec["command"]),
        "Env": ["%s=%s" % (k, v) for k, v in sorted(spec["env"].items())],
        "ExposedPorts": {port: {}},
        "Labels": dict(labels),
        "Healthcheck": {"Test": list(check["test"]), "Interval": duration_ns(check["interval"]),
                        "Timeout": duration_ns(check["timeout"]), "Retries": int(check["retries"]),
                        "StartPeriod": duration_ns(check["start_period"])},
        "HostConfig": host,
    }


def spec_digest(spec: dict) -> str:
    """What the container label onprem.vllm.container holds: a digest of everything the container is made of."""
    return hashlib.sha256(json.dumps(create_body(spec, {}), sort_keys=True).encode()).hexdigest()[:16]
