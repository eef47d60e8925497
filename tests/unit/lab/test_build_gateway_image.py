# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's inventories run the gateway image lab/build_gateway_image.py builds, from the archive it saves."""
from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC = importlib.util.spec_from_file_location("build_gateway_image", os.path.join(ROOT, "lab", "build_gateway_image.py"))
build = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(build)


@pytest.mark.parametrize("relative", ["inventories/lab/group_vars/all/gateway.yml", "molecule/fleet/lab_overlay.yml"])
def test_the_lab_runs_the_gateway_image_it_builds_from_its_archive(relative):
    with open(os.path.join(ROOT, relative)) as handle:
        settings = yaml.safe_load(handle)
    tag = settings["gateway_image_tag"]
    assert "%s:%s" % (settings["gateway_image"], tag) == build.IMAGE_TAG
    assert settings["gateway_image_digest"] == ""  # a local build has no registry digest
    archive = settings["gateway_image_archive"].replace("{{ gateway_image_tag }}", tag)
    assert archive == "/srv/lab-share/images/" + build.TAR.name  # the share is lab/build/share, mounted there
