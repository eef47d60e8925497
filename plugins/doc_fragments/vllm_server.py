# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """The options of the modules that talk to one vLLM server from its host."""

    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the server as seen from the host.
      - C(https://) for a server started with mutual TLS (roles/vllm_server's C(vllm_server_tls_clients)); then
        O(ca_path) is required.
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description: The server's API key, sent as a bearer token; empty when the server has none.
    type: str
    default: ""
  ca_path:
    description:
      - The server's own certificate (PEM), the only one trusted for an https O(url) - self-signed and pinned, no CA;
        the server's host name or address in O(url) must be among its names.
    type: path
    default: ""
  client_cert:
    description:
      - The client certificate (PEM) presented to a server that requires one (the host's C(local) identity); with
        O(client_key).
    type: path
    default: ""
  client_key:
    description: The private key of O(client_cert).
    type: path
    default: ""
"""
