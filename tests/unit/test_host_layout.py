# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's fixed places are stated once (module_utils/host_layout.py): the roles' defaults read them through
the onprem.vllm.host_layout lookup, and the defaults their argument_specs document are checked against them."""
from __future__ import annotations

import glob
import os
import re

import pytest
import yaml
from ansible.errors import AnsibleLookupError

from ansible_collections.onprem.vllm.plugins.lookup.host_layout import LookupModule
from ansible_collections.onprem.vllm.plugins.module_utils.host_layout import HOST_LAYOUT

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOOKUP = re.compile(r"""^\{\{ lookup\('onprem\.vllm\.host_layout', '([a-z_]+)'\) \}\}$""")


def _layout_defaults():
    """(role, variable, layout name) of every role default that is exactly one host_layout lookup."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml"))):
        role = path.split(os.sep)[-3]
        with open(path, encoding="utf-8") as handle:
            for name, value in (yaml.safe_load(handle) or {}).items():
                match = LOOKUP.match(str(value))
                if match:
                    found.append((role, name, match.group(1)))
    return found


def test_the_lookup_returns_the_layout_and_names_what_it_knows():
    assert LookupModule().run(["config_dir", "container_port"]) == ["/etc/onprem-vllm", 8000]
    with pytest.raises(AnsibleLookupError, match="knows config_dir, container_port"):
        LookupModule().run(["config_folder"])


def test_the_roles_read_their_places_from_the_layout():
    assert {(role, name) for role, name, _key in _layout_defaults()} >= {
        ("vllm_server", "vllm_server_config_dir"), ("vllm_server", "vllm_server_gpu_fault_flag"),
        ("monitoring", "monitoring_xid_drain_flag"), ("gateway", "gateway_runtime_dir")}


@pytest.mark.parametrize("role, name, key", _layout_defaults())
def test_each_documented_default_is_the_layouts(role, name, key):
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    documented = {spec["options"][name].get("default") for spec in specs.values() if name in spec.get("options", {})}
    assert documented == {HOST_LAYOUT[key]}, (role, name, documented)
