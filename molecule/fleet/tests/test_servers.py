# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's servers after the side effect: each keeps its deployment record."""
from __future__ import annotations

import json

testinfra_hosts = ["ansible://vllm_servers"]


def test_each_server_keeps_its_deployment_record(host):
    record = host.file("/etc/onprem-vllm/vllm.deployment.json")
    assert record.mode == 0o600
    assert json.loads(record.content_string)["image"].startswith("vllm/vllm-openai:v0.32.0")
