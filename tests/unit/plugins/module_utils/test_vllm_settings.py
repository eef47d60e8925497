# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_settings import as_count, as_fraction, settings_errors

GOOD = {
    "image_tag": "v0.32.0",
    "image_digest": "",
    "model": "Qwen/Qwen3-30B-A3B-FP8",
    "served_model_name": "qwen3-30b-a3b",
    "port": 8000,
    "gpu_memory_utilization": 0.9,
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "max_model_len": 32768,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 8192,
}


def errors_for(**changes):
    return settings_errors({**GOOD, **changes})


def test_good_settings_pass():
    assert settings_errors(GOOD) == []


def test_extra_vars_arrive_as_strings_and_pass():
    assert errors_for(max_model_len="2048", port="8001", gpu_memory_utilization="1", tensor_parallel_size="1") == []


@pytest.mark.parametrize("key", ["max_model_len", "max_num_seqs", "max_num_batched_tokens",
                                 "tensor_parallel_size", "pipeline_parallel_size"])
@pytest.mark.parametrize("value", [-5, 0, "0", "-5", "abc", 2.5, True, "1e3"])
def test_counts_must_be_whole_numbers_from_one(key, value):
    errors = errors_for(**{key: value})
    assert len(errors) == 1
    assert errors[0].startswith(f"vllm_server_{key} must be a whole number >= 1 (got {value!r})")


@pytest.mark.parametrize("key", ["max_model_len", "max_num_seqs", "max_num_batched_tokens"])
def test_optional_counts_may_be_left_to_vllm(key):
    assert errors_for(**{key: None}) == []
    assert errors_for(**{key: ""}) == []
    assert "leave it empty for vLLM's default" in errors_for(**{key: 0})[0]


@pytest.mark.parametrize("key", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_parallel_sizes_are_required(key):
    assert errors_for(**{key: None}) == [f"vllm_server_{key} must be a whole number >= 1 (got None)."]


@pytest.mark.parametrize("port", [0, -1, 65536, "http", None])
def test_port_in_range(port):
    assert errors_for(port=port) == [f"vllm_server_port must be a TCP port 1..65535 (got {port!r})."]


@pytest.mark.parametrize("port", [1, 65535, "8000"])
def test_port_limits_pass(port):
    assert errors_for(port=port) == []


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.01, 90, "abc", None, True])
def test_gpu_memory_utilization_in_zero_one(value):
    assert errors_for(gpu_memory_utilization=value) == [
        f"vllm_server_gpu_memory_utilization must be a fraction in (0, 1], such as 0.9 (got {value!r})."]


@pytest.mark.parametrize("name", ["", "qwen 3", " qwen", "qwen\t3", None, 3])
def test_served_model_name_non_empty_without_spaces(name):
    assert errors_for(served_model_name=name) == [
        "vllm_server_served_model_name must be a non-empty name without spaces, which clients send as \"model\" "
        f"(got {name!r})."]


@pytest.mark.parametrize("tag", ["latest", "", "   ", None, "main", "0.32", "nightly-abc"])
def test_image_tag_pinned(tag):
    errors = errors_for(image_tag=tag)
    assert errors == [f"vllm_server_image_tag must pin a release: pin a tag like v0.32.0 (got {tag!r}; 'latest' or "
                      "an empty tag changes under you and cannot be rolled back to)."]


@pytest.mark.parametrize("tag", ["v0.32.0", "0.32.0", "v0.32.0-lab2", "v0.10.1-cu129"])
def test_release_tags_pass(tag):
    assert errors_for(image_tag=tag) == []


@pytest.mark.parametrize("digest", ["sha256:abc", "md5:" + "0" * 64, "sha256:" + "G" * 64])
def test_image_digest_shape(digest):
    assert errors_for(image_digest=digest) == [
        f"vllm_server_image_digest must look like sha256:<64 hex> or be empty (got {digest!r})."]


def test_image_digest_good():
    assert errors_for(image_digest="sha256:" + "a" * 64) == []


@pytest.mark.parametrize("model", ["/srv/hf-cache/my-model", "/models/x", "/root/.cache/huggingface",
                                   "/root/.cache/huggingface/../../etc"])
def test_model_path_must_be_mounted(model):
    errors = errors_for(model=model)
    assert len(errors) == 1
    assert errors[0].startswith(f"vllm_server_model is the path {model!r}, which the server's container does not "
                                "have: only the HF cache is mounted, at /root/.cache/huggingface.")


@pytest.mark.parametrize("model", ["/root/.cache/huggingface/models/my-model", "onprem-lab/tiny-qwen3"])
def test_model_mounted_path_or_id_passes(model):
    assert errors_for(model=model) == []


@pytest.mark.parametrize("model", ["", "  ", "my model", None])
def test_model_empty_or_spaced(model):
    assert errors_for(model=model) == [
        "vllm_server_model must be a Hugging Face id (org/name) or a path inside the container, without spaces "
        f"(got {model!r})."]


def test_every_mistake_listed_at_once():
    errors = errors_for(max_model_len=-5, max_num_seqs=0, tensor_parallel_size=0, served_model_name="",
                        image_tag="latest", gpu_memory_utilization=1.5, port=70000)
    assert [e.split(" ")[0] for e in errors] == [
        "vllm_server_image_tag", "vllm_server_tensor_parallel_size", "vllm_server_max_model_len",
        "vllm_server_max_num_seqs", "vllm_server_port", "vllm_server_gpu_memory_utilization",
        "vllm_server_served_model_name"]


def test_keys_left_out_are_not_checked():
    assert settings_errors({"max_model_len": 16}) == []


def test_as_count_and_as_fraction():
    assert as_count(" 12 ") == 12
    assert as_count(3.0) == 3
    assert as_count(False) is None
    assert as_fraction("0.5") == 0.5
    assert as_fraction(0) is None
