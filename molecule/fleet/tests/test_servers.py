# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's servers after the side effect: each keeps its deployment record."""
from __future__ import annotations

import json

# By container name: the inventory's ansible_host is the host's lab address (lab_overlay.yml).
testinfra_hosts = ["docker://fleet-ws1", "docker://fleet-ws2", "docker://fleet-ws3"]


def test_each_server_keeps_its_deployment_record(host):
    record = host.file("/etc/onprem-vllm/vllm.deployment.json")
    assert record.mode == 0o600
    assert json.loads(record.content_string)["image"].startswith("vllm/vllm-openai:v0.32.0")
