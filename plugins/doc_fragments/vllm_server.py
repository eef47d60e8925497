# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """The options of the modules that talk to one vLLM server from its host."""

    DOCUMENTATION = r"""
options:
  url:
    description: Base URL of the server as seen from the host.
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description: The server's API key, sent as a bearer token; empty when the server has none.
    type: str
    default: ""
"""
