# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading config.json from files, checkpoint dirs and HF cache snapshots; safetensors sizes from headers."""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.model_config import (
    ModelConfigError,
    checkpoint_weight_bytes,
    load_model_shape,
    parse_config,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models")


def fixture(name):
    return os.path.join(FIXTURES, name)


def test_qwen3_moe_fields():
    shape = load_model_shape(fixture("Qwen3-30B-A3B"))
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_dim) == (48, 32, 4, 128)
    assert (shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size) == (128, 8, 768)
    assert shape.derived_max_model_len == 40960
    assert shape.non_uniform_reason == ""


def test_fp8_block_quantization_is_read():
    shape = load_model_shape(fixture("Qwen3-30B-A3B-FP8") + "/config.json")
    assert shape.quant_method == "fp8"
    assert shape.weight_block_size == (128, 128)
    assert shape.weight_bits == 8.0


def test_vl_config_resolves_text_config():
    shape = load_model_shape(fixture("Qwen3-VL-8B-Instruct"))
    assert (shape.num_layers, shape.num_kv_heads, shape.hidden_size) == (36, 8, 4096)
    assert shape.max_position_embeddings == 262144
    # mrope with rope_type default does not stretch the length
    assert shape.derived_max_model_len == 262144


def test_mla_fields():
    shape = load_model_shape(fixture("DeepSeek-V3"))
    assert shape.is_mla
    assert (shape.kv_lora_rank, shape.qk_rope_head_dim) == (512, 64)
    assert shape.num_dense_layers == 3
    # yarn: original 4096 x factor 40
    assert shape.derived_max_model_len == 163840


def test_sliding_window_layers_are_read_from_layer_types():
    shape = load_model_shape(fixture("gpt-oss-20b"))
    assert shape.layer_kinds[:2] == ("sliding:128", "full") and shape.layer_kinds.count("full") == 12
    assert shape.non_uniform_reason == ""


def test_layer_kinds_derived_where_the_config_lists_none():
    gemma = parse_config({"model_type": "gemma3_text", "num_hidden_layers": 12, "num_attention_heads": 4,
                          "num_key_value_heads": 1, "hidden_size": 1152, "head_dim": 256,
                          "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6})
    assert gemma.layer_kinds == ("sliding:512",) * 5 + ("full",) + ("sliding:512",) * 5 + ("full",)
    nemotron = parse_config({"model_type": "nemotron_h", "num_hidden_layers": 4, "num_attention_heads": 8,
                             "num_key_value_heads": 2, "hidden_size": 512, "attention_head_dim": 128,
                             "max_position_embeddings": 8192, "hybrid_override_pattern": "M-*E",
                             "mamba_num_heads": 8, "mamba_head_dim": 64, "n_groups": 1, "ssm_state_size": 16,
                             "conv_kernel": 4})
    assert nemotron.layer_kinds == ("mamba", "none", "full", "none") and nemotron.head_dim == 128
    assert nemotron.mamba_state == ("mamba2", 4, 512, 1, 16, 8, 64) and nemotron.mamba_ssm_dtype_bytes == 4


def test_unknown_layer_kinds_are_not_guessed():
    odd = parse_config({"model_type": "x", "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,
                        "max_position_embeddings": 2048, "layer_types": ["full_attention", "rnn"]})
    assert odd.layer_kinds == () and "'rnn'" in odd.non_uniform_reason
    hybrid = parse_config({"model_type": "jamba", "num_hidden_layers": 2, "num_attention_heads": 8,
                           "hidden_size": 512, "max_position_embeddings": 2048})
    assert hybrid.layer_kinds == () and "jamba" in hybrid.non_uniform_reason


def test_head_dim_falls_back_to_hidden_over_heads():
    shape = parse_config({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,
                          "max_position_embeddings": 2048})
    assert shape.head_dim == 64
    assert shape.num_kv_heads == 8  # no num_key_value_heads: multi-head attention


def test_missing_heads_names_the_field():
    with pytest.raises(ModelConfigError, match="num_attention_heads"):
        parse_config({"num_hidden_layers": 2, "hidden_size": 512, "max_position_embeddings": 2048}, "x/config.json")


def test_bad_type_names_the_field():
    with pytest.raises(ModelConfigError, match="num_key_value_heads must be a non-negative integer"):
        parse_config({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": "four",
                      "hidden_size": 512, "max_position_embeddings": 2048})


def test_missing_path_and_bad_json(tmp_path):
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_model_shape(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read"):
        load_model_shape(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelConfigError, match="without config.json"):
        load_model_shape(str(empty))


def _write_safetensors(path, tensors):
    """A header-only safetensors file: the data section is sparse, only offsets matter."""
    header, offset = {}, 0
    for name, nbytes in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [nbytes // 2], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)


def test_safetensors_headers_are_summed(tmp_path):
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": 1000, "b": 24})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": 2048})
    assert checkpoint_weight_bytes(str(tmp_path)) == 3072


def test_index_total_size_wins(tmp_path):
    index = {"metadata": {"total_size": 123456}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _write_safetensors(tmp_path / "model.safetensors", {"a": 10})
    assert checkpoint_weight_bytes(str(tmp_path)) == 123456


def test_hf_cache_repo_folder_uses_refs_main(tmp_path):
    repo = tmp_path / "models--Qwen--Qwen3-0.6B"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(fixture("Qwen3-0.6B") + "/config.json", snap / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    _write_safetensors(snap / "model.safetensors", {"w": 4096})
    shape = load_model_shape(str(repo))
    assert shape.num_layers == 28
    assert shape.checkpoint_bytes == 4096
    assert shape.source.endswith(os.path.join("abc123", "config.json"))


def test_gemma3_multimodal_config_takes_its_text_defaults():
    """The hub's gemma-3-27b-it text_config states only what differs from Gemma3TextConfig's defaults."""
    configs = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "benchmarks", "gpu_compare",
                           "model-configs")
    full = load_model_shape(os.path.join(configs, "gemma-3-27b-it"))
    text = load_model_shape(os.path.join(configs, "gemma-3-27b-it-text"))
    for name in ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings", "layer_kinds",
                 "tie_word_embeddings"):
        assert getattr(full, name) == getattr(text, name), name
    assert full.vision_parameters > 400_000_000 and text.vision_parameters == 0
    assert full.vision_tokens_per_item == (("image", 256),)


@pytest.mark.parametrize("model, elements", [
    # vLLM 0.26's get_rope: one cos/sin cache per distinct rotary embedding, [positions, rotary dim]
    ("Qwen3-8B", 40960 * 128),
    ("Qwen3-VL-30B-A3B-Instruct", 262144 * 4 * 128),  # MRotaryEmbedding: max_position_embeddings x 4
    ("gemma-3-27b-it-text", 131072 * 8 * 128 + 131072 * 128),  # linear x 8, and the sliding layers' unscaled one
    ("gemma-3-27b-it", 131072 * 8 * 128 + 131072 * 128),  # the same from the multimodal config's text defaults
    ("Qwen3-Next-80B-A3B-Instruct-FP8", 262144 * 64),  # partial_rotary_factor 0.25 of head_dim 256
    ("gpt-oss-20b", 4096 * 32 * 64),  # YaRN: the original length x the factor
    ("granite-4.0-h-tiny", 0),  # NoPE
])
def test_rope_cache_elements_follow_vllms_rotary_embeddings(model, elements):
    configs = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "benchmarks", "gpu_compare",
                           "model-configs")
    assert load_model_shape(os.path.join(configs, model)).rope_cache_elements == elements
