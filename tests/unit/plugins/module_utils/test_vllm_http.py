# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP from a host to its vLLM server, plain and with mutual TLS, against a real local server (conftest)."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_http


def params(url, api_key="", ca_path="", client_cert="", client_key=""):
    return dict(url=url, api_key=api_key, ca_path=ca_path, client_cert=client_cert, client_key=client_key)


@pytest.mark.parametrize("options, problem", [
    (params("http://127.0.0.1:8000"), ""),
    (params("https://h:8000", ca_path="/c", client_cert="/a", client_key="/k"), ""),
    (params("https://h:8000", ca_path="/c"), ""),
    (params("https://h:8000"), "needs ca_path"),
    (params("https://h:8000", ca_path="/c", client_cert="/a"), "go together"),
    (params("https://h:8000", ca_path="/c", client_key="/k"), "go together"),
    (params("http://h:8000", ca_path="/c"), "plain http"),
])
def test_tls_options_must_fit_together(options, problem):
    found = vllm_http.tls_problem(options)
    assert (problem in found and found) if problem else found == ""


def test_missing_tls_files_are_named_before_anything_is_sent(tmp_path):
    found = vllm_http.tls_files_problem(params("https://h:8000", ca_path=str(tmp_path / "none.crt")))
    assert "none.crt" in found
    assert vllm_http.tls_files_problem(params("http://h:8000")) == ""


def test_plain_http_answers_and_errors_are_answers(vllm_endpoints):
    server = vllm_http.Server(params(vllm_endpoints.url, api_key=vllm_endpoints.key))
    assert server.request("GET", "/v1/models").status == 200
    assert vllm_endpoints.seen[-1] == ("GET", "/v1/models", "Bearer " + vllm_endpoints.key)
    unkeyed = vllm_http.Server(params(vllm_endpoints.url)).request("GET", "/v1/models")
    assert unkeyed.status == 401 and "Unauthorized" in unkeyed.body


def test_a_server_that_is_not_up_raises_oserror(free_port):
    with pytest.raises(OSError):
        vllm_http.Server(params("http://127.0.0.1:%d" % free_port()), timeout=2).request("GET", "/health")


def test_mutual_tls_with_the_pinned_server_and_the_trusted_client(vllm_endpoints_tls):
    srv = vllm_endpoints_tls
    server = vllm_http.Server(params(srv.url, api_key=srv.key, ca_path=srv.server_cert,
                                     client_cert=srv.client[0], client_key=srv.client[1]))
    answer = server.request("POST", "/v1/chat/completions", {"model": "q", "messages": []})
    assert answer.status == 200 and '"OK"' in answer.body


@pytest.mark.parametrize("who", ["stranger", "nobody"])
def test_the_server_refuses_a_client_it_does_not_trust(vllm_endpoints_tls, who):
    srv = vllm_endpoints_tls
    identity = {"stranger": srv.stranger, "nobody": ("", "")}[who]
    server = vllm_http.Server(params(srv.url, ca_path=srv.server_cert, client_cert=identity[0],
                                     client_key=identity[1]), timeout=5)
    with pytest.raises(OSError):
        server.request("GET", "/health")
    assert not srv.seen


def test_the_client_refuses_a_server_that_is_not_the_pinned_one(vllm_endpoints_tls, tmp_path):
    srv = vllm_endpoints_tls
    # The trusted client's own certificate stands for "any other certificate": the server's is not it.
    server = vllm_http.Server(params(srv.url, ca_path=srv.client[0], client_cert=srv.client[0],
                                     client_key=srv.client[1]), timeout=5)
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        server.request("GET", "/health")
    assert not srv.seen
