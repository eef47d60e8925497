# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""benchmarks/gpu_server runs inventories/example's settings on a lent GPU machine: its group_vars are the example's
files (links), and its overlay holds only the keys allowed below, each for a reason that cannot exist there. A key
added to the overlay fails here until it is listed with its reason: a setting the GPU run overrides is one it does not
test."""
from __future__ import annotations

import os

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "inventories", "example", "group_vars")
INVENTORY = os.path.join(ROOT, "benchmarks", "gpu_server", "inventory")

ALLOWED = {
    "ansible_connection": "the playbook runs on the GPU machine itself (no SSH there)",
    "ansible_python_interpreter": "the GPU machine's Python, which holds PyTorch and nvidia-ml-py",
    "onprem_vllm_image_tag": "the vLLM release the GPU machine runs (benchmarks/gpu_compare/pack.sh)",
    "onprem_vllm_deployment_overrides": "one GPU: the router on its own GPU, and dummy weights (no hub)",
    "gpu_server_state_dir": "where run.sh keeps what it makes on the GPU machine",
}


def test_the_gpu_overlay_holds_only_allowed_keys():
    with open(os.path.join(INVENTORY, "group_vars", "zz_gpu_overlay.yml")) as handle:
        overlay = yaml.safe_load(handle)
    assert set(overlay) <= set(ALLOWED), sorted(set(overlay) - set(ALLOWED))
    # Only the router's placement and weights change: its model, context and pool are the example's.
    assert overlay["onprem_vllm_deployment_overrides"] == {
        "router": {"shares_gpu_with": "", "extra_args": ["--load-format", "dummy"]}}


def test_the_gpu_inventory_reads_the_examples_own_plan_and_server_settings():
    for relative in (os.path.join("all", "plan.yml"), "vllm_servers"):
        path = os.path.join(INVENTORY, "group_vars", relative)
        assert os.path.islink(path), path
        assert os.path.realpath(path) == os.path.realpath(os.path.join(EXAMPLE, relative)), path
