# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module over real HTTP against conftest's hf_hub_double (a TEST DOUBLE of huggingface.co: the hub cannot be
reached here; its answers are shaped as the hub's API gives them): the token sent as a bearer token and never
returned, the hub's refusals turned into messages that say what to do."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.onprem.vllm.plugins.modules import hf_model_info

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")
MODEL = "Qwen/Qwen3-30B-A3B-FP8"
COMMIT = "c" * 40
TOKEN = "hf_test_token_0123456789"
with open(os.path.join(FIXTURES, "Qwen3-30B-A3B-FP8", "config.json"), encoding="utf-8") as _handle:
    CONFIG = json.load(_handle)


@pytest.fixture
def hub(hf_hub_double):
    """The hub double holding the model at COMMIT (main points there): config.json and a 31 GB safetensors file listed
    by size; the token required."""
    return hf_hub_double({MODEL: {"sha": COMMIT, "files": {"config.json": CONFIG,
                                                           "model.safetensors": 31_000_000_000}}}, token=TOKEN)


@pytest.fixture
def call(call_module):
    return lambda **args: call_module(hf_model_info, **args)


def test_hub_facts_with_the_token(call, hub):
    endpoint, seen = hub
    rc, out = call(source="hub", model=MODEL, revision="main", hub_endpoint=endpoint, token=TOKEN)
    assert rc == 0, out
    info = out["model_info"]
    config_bytes = len(json.dumps(CONFIG).encode())
    assert (info["commit"], info["size_bytes"], info["weight_bytes"]) == (COMMIT, 31_000_000_000 + config_bytes,
                                                                          31_000_000_000)
    assert (info["quantization"], info["config"]) == ("fp8", CONFIG)
    assert out["changed"] is False
    assert set(seen) == {"Bearer " + TOKEN}
    assert TOKEN not in json.dumps(out)


def test_hub_refusals_say_what_to_do(call, hub):
    endpoint, _seen = hub
    rc, out = call(source="hub", model=MODEL, revision="main", hub_endpoint=endpoint)
    assert rc == 1
    assert "answered 401" in out["msg"] and "Vault-held hub token" in out["msg"]
    rc, out = call(source="hub", model=MODEL, revision="v9", hub_endpoint=endpoint, token=TOKEN)
    assert rc == 1
    assert "answered 404" in out["msg"] and "no such model or revision" in out["msg"]
    assert out["msg"].startswith("%s at v9: " % MODEL)


def test_unreachable_hub(call):
    rc, out = call(source="hub", model=MODEL, revision="main", hub_endpoint="http://127.0.0.1:9", request_timeout=5)
    assert rc == 1 and "cannot reach http://127.0.0.1:9/api/models/" in out["msg"]


def test_cache_and_archive_need_a_path(call):
    rc, out = call(source="archive", model=MODEL, revision=COMMIT)
    assert rc == 1 and "path" in out["msg"]
