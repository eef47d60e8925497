# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The example inventory (inventories/example), the one operators copy, parses from this checkout: its groups hold the
hosts its hosts.yml names, and every host gets its groups' group_vars. The expectations are read from the example's
own YAML, so the test follows the example. That its plan passes the plan check: tests/unit/roles/test_plan_check.py."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "inventories", "example")
ANSIBLE_INVENTORY = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")


def load(path):
    with open(path) as handle:
        return yaml.safe_load(handle)  # an inline !vault value would stop here: the example ships placeholders


def yaml_groups(group, name="all", found=None):
    """{group: (its hosts, its children's names)} of a hosts.yml: a group may be named in several places (vllm_servers
    under all and, without its hosts, under vllm_monitoring), its hosts and children gathered from each."""
    found = {} if found is None else found
    hosts, children = found.setdefault(name, (set(), set()))
    hosts.update((group or {}).get("hosts") or {})
    for child, below in ((group or {}).get("children") or {}).items():
        children.add(child)
        yaml_groups(below, child, found)
    return found


def yaml_hosts(groups, name):
    """The hosts of a group of yaml_groups, its children's included."""
    hosts, children = groups.get(name, (set(), set()))
    return set(hosts).union(*(yaml_hosts(groups, child) for child in children))


def listed_hosts(listing, name):
    """The hosts of a group of `ansible-inventory --list`, its children's included."""
    group = listing.get(name, {})
    return set(group.get("hosts", [])).union(*(listed_hosts(listing, child) for child in group.get("children", [])))


def group_vars(group):
    """The variables of group_vars/<group>/*.yml, as written (ansible-inventory --list templates nothing)."""
    merged = {}
    for path in sorted(glob.glob(os.path.join(EXAMPLE, "group_vars", group, "*.yml"))):
        merged.update(load(path) or {})
    return merged


@pytest.fixture(scope="module")
def listing(tmp_path_factory):
    """`ansible-inventory -i inventories/example --list` from the checkout (its ansible.cfg), as an operator runs it,
    with the lab's vault id swapped for an operator's whose password decrypts nothing: the example needs no password."""
    password = tmp_path_factory.mktemp("vault") / "operator.pw"
    password.write_text("not the lab password\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_VAULT_IDENTITY_LIST"] = "operator@%s" % password
    proc = subprocess.run([ANSIBLE_INVENTORY, "-i", "inventories/example", "--list"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[WARNING]" not in proc.stderr, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_example_groups_hold_the_hosts_its_hosts_yml_names(listing):
    groups = yaml_groups(load(os.path.join(EXAMPLE, "hosts.yml"))["all"])
    for group in ("vllm_servers", "vllm_gateways", "vllm_monitoring"):
        expected = yaml_hosts(groups, group)
        assert expected, "inventories/example/hosts.yml has no host in %s" % group
        assert listed_hosts(listing, group) == expected, group


def test_every_example_host_gets_its_groups_group_vars(listing):
    hostvars = listing["_meta"]["hostvars"]
    for group in ("vllm_servers", "vllm_gateways"):
        wanted = dict(group_vars("all"), **group_vars(group))
        for host in listed_hosts(listing, group):
            got = {name: hostvars[host].get(name) for name in wanted}
            assert got == wanted, host


def test_the_example_serves_its_plan_with_tensor_parallel_2_behind_a_tls_gateway(listing):
    plan = load(os.path.join(EXAMPLE, "group_vars", "all", "plan.yml"))
    hostvars = listing["_meta"]["hostvars"]
    for host in listed_hosts(listing, "vllm_servers"):
        assert hostvars[host]["onprem_vllm_model"] == plan["onprem_vllm_model"]
        assert hostvars[host]["onprem_vllm_tensor_parallel_size"] == plan["onprem_vllm_tensor_parallel_size"] == 2
    for host in listed_hosts(listing, "vllm_gateways"):
        assert hostvars[host]["gateway_tls_certificate"] == "{{ vault_gateway_tls_certificate }}"
        assert "vault_gateway_tls_certificate" in hostvars[host]
