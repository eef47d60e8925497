# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's servers after the side effect: each keeps the deployment record of the server it runs."""
from __future__ import annotations

import json
import re

# By container name: the inventory's ansible_host is the host's lab address (lab_overlay.yml).
testinfra_hosts = ["docker://fleet-ws1", "docker://fleet-ws2", "docker://fleet-ws3"]

# The two tags the lab's image store holds (lab/image_store.py); the rollouts move the servers between them.
LAB_TAGS = re.compile(r"vllm/vllm-openai:v0\.32\.0(-lab2)?")


# The containers of the fleet's deployments on each host (inventories/example: chat everywhere, router and embed on
# fleet-ws3, the lab's vllm_rag host).
EXPECTED = {"fleet-ws1": ["vllm"], "fleet-ws2": ["vllm"], "fleet-ws3": ["vllm", "vllm-embed", "vllm-router", "vllm-vision"]}


def test_each_server_keeps_its_deployment_record(host):
    names = sorted(host.check_output(
        "docker ps --filter label=onprem.vllm.deployment --format '{{.Names}}'").split())
    assert names == EXPECTED[host.backend.name], names
    for name in names:
        record = host.file("/etc/onprem-vllm/%s.deployment.json" % name)
        assert record.mode == 0o600, name
        recorded = json.loads(record.content_string)["image"].split("@")[0]
        running = host.check_output("docker inspect --format '{{.Config.Image}}' %s" % name).split("@")[0]
        assert recorded == running, name
        assert LAB_TAGS.fullmatch(running), name
