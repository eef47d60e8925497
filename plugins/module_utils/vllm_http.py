# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP from a host to one of its vLLM servers, for every module that talks to one (the deployment, the gates, the
KV check): the options they share, and one request function.

A server started with mutual TLS (roles/vllm_server, vllm_server_tls_clients) is reached over https: its own
certificate is the only one trusted (ca_path, pinned: no CA), and the host presents its local client identity
(client_cert, client_key). A plain http server is reached as before.
"""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import Response

# The options of plugins/doc_fragments/vllm_server.py, for a module's argument_spec.
SERVER_ARGUMENT_SPEC = dict(
    url=dict(type="str", default="http://127.0.0.1:8000"),
    api_key=dict(type="str", default="", no_log=True),
    ca_path=dict(type="path", default=""),
    client_cert=dict(type="path", default=""),
    client_key=dict(type="path", default=""),
)


def tls_problem(params: dict) -> str:
    """What is wrong with the TLS options, in words ('' when they fit together)."""
    https = params["url"].lower().startswith("https://")
    if bool(params["client_cert"]) != bool(params["client_key"]):
        return "client_cert and client_key go together: set both (the host's client identity) or neither"
    if https and not params["ca_path"]:
        return ("an https url needs ca_path: the server's certificate (self-signed and pinned, so the system's CAs "
                "never vouch for it)")
    if not https and (params["ca_path"] or params["client_cert"]):
        return "ca_path, client_cert and client_key are for an https url; %s is plain http" % params["url"]
    return ""


def tls_files_problem(params: dict) -> str:
    """Whether the TLS files can be used, in words ('' when they can): checked before a module changes anything, as
    a missing certificate would otherwise look like a server that is not up yet."""
    if not params["ca_path"]:
        return ""
    try:
        ssl_context(params["ca_path"], params["client_cert"], params["client_key"])
    except (OSError, ValueError) as exc:
        return "cannot use the server's certificate %s or the client identity %s: %s" % (
            params["ca_path"], params["client_cert"] or "(none)", exc)
    return ""


def ssl_context(ca_path: str = "", client_cert: str = "", client_key: str = "") -> ssl.SSLContext | None:
    """The context for an https server: only the pinned certificate is trusted, the host name checked against it.
    None for plain http (no ca_path)."""
    if not ca_path:
        return None
    context = ssl.create_default_context(cafile=ca_path)
    if client_cert:
        context.load_cert_chain(client_cert, client_key or None)
    return context


class Server:
    """One server as a module's parameters describe it; `request` is the gates' `http(method, path, body)`."""

    def __init__(self, params: dict, timeout: float = 60.0):
        self.url = params["url"].rstrip("/")
        self.api_key = params["api_key"]
        self.timeout = timeout
        self.tls_files = (params["ca_path"], params["client_cert"], params["client_key"])
        self._context = None
        self._opener = None

    @property
    def context(self) -> ssl.SSLContext | None:
        """Made at the first request: a run in check mode on a new host has no certificate yet and sends none."""
        if self._context is None and self.tls_files[0]:
            self._context = ssl_context(*self.tls_files)
        return self._context

    def request(self, method: str, path: str, body=None, timeout: float | None = None) -> Response:
        """The answer's status and body (an HTTP error is an answer, not an exception); a connection that fails
        raises OSError (urllib.error.URLError is one), as the callers expect while a server starts."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        if self._opener is None:
            # No proxy: the server is on this host or its LAN, and a proxy would see the key.
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                       urllib.request.HTTPSHandler(context=self.context))
        try:
            with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                return Response(resp.status, resp.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            return Response(exc.code, exc.read().decode("utf-8", "replace"))
