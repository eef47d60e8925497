# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment keys are one table (module_utils/deployments.py): the plan check's argument_specs document exactly
those keys, and every fleet-wide default they take is a documented plan variable."""
from __future__ import annotations

import os

import yaml

from ansible_collections.onprem.vllm.plugins.module_utils import deployments

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _plan_options():
    with open(os.path.join(ROOT, "roles", "plan_check", "meta", "argument_specs.yml")) as handle:
        return yaml.safe_load(handle)["argument_specs"]["main"]["options"]


def test_the_argument_specs_document_every_deployment_key_and_no_other():
    documented = set(_plan_options()["onprem_vllm_deployments"]["options"])
    assert documented == set(deployments.KNOWN_KEYS), (
        f"undocumented: {sorted(set(deployments.KNOWN_KEYS) - documented)}; "
        f"not deployment keys: {sorted(documented - set(deployments.KNOWN_KEYS))}")


def test_every_fleet_wide_default_is_a_documented_plan_variable():
    options = _plan_options()
    missing = [key for key in deployments.FLEET_KEYS if "onprem_vllm_" + key not in options]
    assert not missing, f"deployment keys whose onprem_vllm_<key> the plan check does not document: {missing}"


def test_each_deployment_key_reaches_the_roles():
    """playbooks/vars/deployment.yml maps a deployment's keys to the plan variables every role defaults from."""
    with open(os.path.join(ROOT, "playbooks", "vars", "deployment.yml")) as handle:
        mapped = yaml.safe_load(handle)
    placement_only = {"name", "hosts", "shares_gpu_with", "shared_gpu_index"}
    missing = [key for key in sorted(set(deployments.KNOWN_KEYS) - placement_only) if "onprem_vllm_" + key not in mapped]
    assert not missing, f"deployment keys no role receives: {missing}"
