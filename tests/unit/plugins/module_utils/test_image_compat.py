# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM image tag -> CUDA -> minimum driver branch, and the refusals with the tag variant or branch to choose."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import image_compat as ic


@pytest.mark.parametrize("tag, cuda", [
    ("v0.32.0", (13, 0)), ("v0.34.0", (13, 0)), ("v0.20.0", (13, 0)), ("0.26.0", (13, 0)),
    ("v0.32.0-cu129", (12, 9)), ("v0.20.2-cu129", (12, 9)), ("v0.21.0-cu130", (13, 0)), ("v0.18.0-cu128", (12, 8)),
    ("v0.19.1", (12, 8)), ("v0.11.0", (12, 8)),
    ("v0.32.0-lab2", (13, 0)),  # a local suffix that names no CUDA keeps the release's default
])
def test_cuda_from_the_tag(tag, cuda):
    assert ic.image_cuda(tag)[0] == cuda


def test_the_newest_release_needs_r580():
    """v0.34.0, unsuffixed, is a CUDA 13.0 build (the default since 0.20): driver 580.65.06 or later."""
    assert ic.min_driver(ic.image_cuda("v0.34.0")[0]) == (580, "580.65.06")


def test_override_wins_and_is_validated():
    assert ic.image_cuda("v0.32.0", "12.9")[0] == (12, 9)
    assert ic.image_cuda("v0.32.0", "12.9.1")[0] == (12, 9)
    assert "onprem_vllm_image_cuda='twelve' is not a CUDA version" in ic.image_cuda("v0.32.0", "twelve")[2]


@pytest.mark.parametrize("cuda, branch, version", [
    ((13, 0), 580, "580.65.06"), ((12, 9), 575, "575.51.03"), ((12, 8), 570, "570.26"), ((12, 4), 550, "550.54.14"),
    ((12, 7), 570, "570.26"),  # between rows: the next row up
    ((13, 1), 580, "580.65.06"),  # beyond the table: at least the newest row
])
def test_min_driver(cuda, branch, version):
    assert ic.min_driver(cuda) == (branch, version)


def test_default_image_on_r580_passes():
    res = ic.check("v0.32.0", planned_branch="580")
    assert res["ok"] and res["cuda"] == "13.0" and res["min_branch"] == 580


def test_h200_driver_runs_the_default_image():
    # The lent H200's driver (tests/unit/fixtures/gpu/h200-x1).
    assert ic.check("v0.32.0", installed_version="580.159.04")["ok"]


def test_planned_r575_with_the_cuda13_image_names_the_cu129_variant():
    res = ic.check("v0.32.0", planned_branch="575")
    assert not res["ok"]
    (msg,) = res["errors"]
    assert "planned driver branch R575 (nvidia_driver_branch) cannot run the image" in msg
    assert "v0.32.0 is built for CUDA 13.0, which needs driver branch R580 or newer (>= 580.65.06)" in msg
    assert 'set nvidia_driver_branch: "580"' in msg
    assert "pin onprem_vllm_image_tag: v0.32.0-cu129 (CUDA 12.9, runs on R575)" in msg


def test_planned_r570_with_cu129_names_the_branch_and_an_older_release():
    (msg,) = ic.check("v0.32.0-cu129", planned_branch="570")["errors"]
    assert 'set nvidia_driver_branch: "575"' in msg
    assert "a vLLM release before 0.20" in msg


def test_installed_older_driver_is_refused():
    (msg,) = ic.check("v0.32.0", installed_version="570.124.06")["errors"]
    assert msg.startswith("The installed driver 570.124.06 cannot run the image")


def test_installed_driver_on_the_branch_but_too_old():
    (msg,) = ic.check("v0.32.0-cu129", installed_version="575.40.01")["errors"]
    assert "upgrade the driver to 575.51.03 or newer" in msg


@pytest.mark.parametrize("tag", ["latest", "nightly", "", "main-cu129"])
def test_unreadable_tag_is_refused(tag):
    (msg,) = ic.check(tag, planned_branch="580")["errors"]
    assert "is not a vLLM release tag such as v0.32.0" in msg


def test_bad_branch_and_version_are_refused():
    assert 'is not a driver branch such as "580"' in ic.check("v0.32.0", planned_branch="R580")["errors"][0]
    assert "is not a driver version such as 580.95.05" in ic.check("v0.32.0", installed_version="580")["errors"][0]
