# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_deployment module's failures before it touches Docker: every failure says what the rollout's rescue reads
(nothing replaced or rolled back) and the server's facts. Its actions run against real Docker engines in the
vllm_server and fleet scenarios."""
from __future__ import annotations

import json

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_deployment

ARGS = {"name": "vllm-chat", "config_dir": "/nonexistent/onprem-vllm", "state": "settled", "api_key": "sk-never-shown",
        "endpoint": "https://ws-01.example.internal:8000/v1"}


@pytest.mark.parametrize(("args", "message"), [
    ({"url": "https://127.0.0.1:8000", "ca_path": "", "client_cert": "", "client_key": ""}, "an https url needs ca_path"),
    ({"url": "https://127.0.0.1:8000", "ca_path": "/nonexistent/server.crt", "client_cert": "", "client_key": ""},
     "cannot use the server's certificate /nonexistent/server.crt"),
])
def test_a_tls_problem_fails_with_what_the_rescue_reads(call_module, args, message):
    rc, result = call_module(vllm_deployment, **ARGS, **args)
    assert rc == 1 and message in result["msg"]
    assert (result["replaces"], result["rolled_back"], result["outcome"]) == (False, False, "failed")
    assert (result["state"], result["local_url"], result["endpoint"]) == ("settled", args["url"], ARGS["endpoint"])
    assert "sk-never-shown" not in json.dumps(result)
