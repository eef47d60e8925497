# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_image_compat module: the lab's pinned image against the lent H200's driver (580.159.04, as it reported
itself: tests/unit/fixtures/gpu/h200-x1) in check mode, applied and again; and a misfit, failed or returned."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_image_compat

H200_DRIVER = "580.159.04"


@pytest.fixture
def compat(call_module):
    return lambda **args: call_module(vllm_image_compat, **args)


def test_check_apply_and_again_give_the_same_answer_and_change_nothing(compat):
    runs = [compat(image_tag="v0.32.0", planned_branch="580", installed_version=H200_DRIVER, _ansible_check_mode=mode)
            for mode in (True, False, False)]
    for rc, result in runs:
        assert rc == 0 and result["changed"] is False and result["errors"] == []
        assert result["cuda"] == "13.0" and result["min_branch"] == 580 and result["min_version"] == "580.65.06"
    assert runs[0][1] == runs[1][1] == runs[2][1]


def test_a_driver_too_old_for_the_image_fails_with_the_variant_to_pin(compat):
    rc, result = compat(image_tag="v0.32.0", planned_branch="575")
    assert rc == 1 and result["failed"] and result["changed"] is False
    assert "pin onprem_vllm_image_tag: v0.32.0-cu129 (CUDA 12.9, runs on R575)" in result["msg"]
    assert result["errors"] == [result["msg"]]


def test_misfit_returned_without_failing(compat):
    rc, result = compat(image_tag="v0.32.0", installed_version="570.124.06", fail_on_misfit=False)
    assert rc == 0 and not result.get("failed")
    assert result["errors"][0].startswith("The installed driver 570.124.06 cannot run the image")


def test_an_unpinned_tag_is_refused(compat):
    rc, result = compat(image_tag="latest", planned_branch="580")
    assert rc == 1 and "is not a vLLM release tag such as v0.32.0" in result["msg"]
