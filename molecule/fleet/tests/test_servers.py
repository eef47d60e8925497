# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's servers after the side effect: each keeps its deployment record and the one before."""
from __future__ import annotations

import json

testinfra_hosts = ["ansible://vllm_servers"]


def test_each_server_keeps_its_previous_record(host):
    for name in ("vllm.deployment.json", "vllm.deployment.previous.json"):
        f = host.file("/etc/onprem-vllm/" + name)
        assert f.mode == 0o600, name
        assert json.loads(f.content_string)["image"].startswith("vllm/vllm-openai:v0.32.0"), name
