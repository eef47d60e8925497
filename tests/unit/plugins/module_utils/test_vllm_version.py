# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one parser of a vLLM release tag."""
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_version


@pytest.mark.parametrize("text,expected", [
    ("v0.32.0", ((0, 32, 0), "")), ("0.32.0", ((0, 32, 0), "")), ("v0.32.0-cu129", ((0, 32, 0), "-cu129")),
    ("v0.11.0rc1", ((0, 11, 0), "rc1")), (" v0.32.0-lab2 ", ((0, 32, 0), "-lab2")), ("v1.2.10", ((1, 2, 10), "")),
])
def test_a_release_tag(text, expected):
    assert vllm_version.parse_tag(text) == expected
    assert vllm_version.parse(text) == expected[0]


@pytest.mark.parametrize("text", ["latest", "", None, "v0.32", "nightly-0.32.0", "0.x.0"])
def test_what_is_not_a_release(text):
    assert vllm_version.parse_tag(text) is None and vllm_version.parse(text) is None
