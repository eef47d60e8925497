# -*- coding: utf-8 -*-
# Copyright: onprem.vllm contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a Hugging Face checkpoint's config.json into the shape the KV planner needs.

Accepts a config.json file, a checkpoint directory, an HF cache repo folder (models--Org--Name) or one of its
snapshots. Multimodal configs are resolved to their language model (``text_config``). Weight sizes come from
``model.safetensors.index.json`` (metadata.total_size) or from the safetensors headers; weight files are never read
beyond their header. Standard library only: this runs on managed hosts.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Optional


class ModelConfigError(ValueError):
    """A config.json that cannot be planned for; the message names the file and the field."""


# Model types whose KV cache vLLM splits into per-layer groups (sliding window, chunked local attention,
# linear attention, Mamba): the uniform formula does not describe them.
NON_UNIFORM_MODEL_TYPES = frozenset({
    "gemma2", "gemma3", "gemma3_text", "gemma3n", "gpt_oss", "cohere2", "llama4", "llama4_text",
    "qwen3_next", "jamba", "falcon_h1", "nemotron_h", "granitemoehybrid", "bamba", "zamba2", "minimax_text_01",
    "minimax_m1", "plamo2", "lfm2", "mamba", "mamba2", "kimi_linear", "mimo_v2_flash", "exaone4", "hunyuan_v1_dense",
})

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs to know about the language model of a checkpoint."""

    source: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    derived_max_model_len: int
    rope_scaling_type: Optional[str] = None
    tie_word_embeddings: bool = False
    # MLA (DeepSeek V2/V3, Kimi K2): one latent "head" of kv_lora_rank + qk_rope_head_dim per token and layer.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    # Quantization of the checkpoint's weights (not of the KV cache).
    quant_method: Optional[str] = None
    weight_bits: float = 16.0
    weight_block_size: Optional[tuple] = None
    # Why the KV cache cannot be described (a layer mix the planner does not know); empty when it can.
    non_uniform_reason: str = ""
    # Per-layer KV kind where the layers differ (vLLM puts each kind in its own KV-cache groups): "full",
    # "sliding:<window>", "mamba" (a recurrent state: Mamba2 or gated delta net) or "none" (an MLP-only layer).
    # Empty: every layer is full attention.
    layer_kinds: tuple = ()
    # The recurrent state of the "mamba" layers: ("mamba2", d_conv, intermediate, n_groups, d_state, n_heads,
    # head_dim) or ("gated_delta_net", conv_kernel, num_k_heads, head_k_dim, num_v_heads, head_v_dim).
    mamba_state: tuple = ()
    # Bytes per element of the SSM state when vLLM does not follow the model dtype (Nemotron-H: fp32); 0: it does.
    mamba_ssm_dtype_bytes: int = 0
    # The vision encoder of a vision-language checkpoint (vision_config): its parameters; the modalities it serves
    # with the most tokens one item of each can become (vLLM's get_mm_max_tokens_per_item; empty where the planner
    # does not know the family's processor); the width of what it hands the language model per token (all
    # deepstack levels of Qwen3-VL included), and vLLM's deepstack input buffers (one per level).
    vision_parameters: int = 0
    vision_tokens_per_item: tuple = ()
    vision_output_width: int = 0
    deepstack_levels: int = 0
    # The rotary embeddings' cos/sin caches vLLM makes when it builds the model (in the model dtype, on every GPU):
    # positions x rotary dim, summed over its distinct rotary embeddings (rope_cache_elements below).
    rope_cache_elements: int = 0
    checkpoint_bytes: Optional[int] = None
    extra: dict = field(default_factory=dict)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def _first(cfg: dict, *names: str) -> Any:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return value
    return None


def _positive_int(cfg: dict, source: str, names: tuple, required: bool = True, default: int = 0) -> int:
    value = _first(cfg, *names)
    if value is None:
        if required:
            raise ModelConfigError(
                "%s has no %s: the planner needs it to size the KV cache (a complete Hugging Face config.json "
                "has it)" % (source, " / ".join(names)))
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError("%s: %s must be a non-negative integer, got %r" % (source, names[0], value))
    return value


def _hf_cache_snapshot(path: str) -> Optional[str]:
    """For an HF cache repo folder (models--Org--Name), the snapshot that refs/main points at, else the newest."""
    snapshots = os.path.join(path, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    ref_main = os.path.join(path, "refs", "main")
    if os.path.isfile(ref_main):
        with open(ref_main, "r", encoding="utf-8") as handle:
            revision = handle.read().strip()
        candidate = os.path.join(snapshots, revision)
        if os.path.isfile(os.path.join(candidate, "config.json")):
            return candidate
    candidates = [os.path.join(snapshots, name) for name in os.listdir(snapshots)]
    candidates = [c for c in candidates if os.path.isfile(os.path.join(c, "config.json"))]
    if not candidates:
        return None
    return max(candidates, key=os.path.getmtime)


def resolve_config_path(path: str) -> tuple:
    """Return (config.json path, checkpoint directory) for a file, checkpoint dir, HF cache repo or snapshot."""
    if not path:
        raise ModelConfigError("model_config_path is empty: give a config.json, a checkpoint directory or an HF "
                               "cache snapshot")
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        return path, os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        direct = os.path.join(path, "config.json")
        if os.path.isfile(direct):
            return direct, path
        snapshot = _hf_cache_snapshot(path)
        if snapshot:
            return os.path.join(snapshot, "config.json"), snapshot
        raise ModelConfigError("model_config_path %s is a directory without config.json (nor an HF cache repo "
                               "folder with a snapshot holding one)" % path)
    raise ModelConfigError("model_config_path %s does not exist" % path)


def load_config_dict(path: str) -> tuple:
    config_path, checkpoint_dir = resolve_config_path(path)
    try:
        with open(config_path, "r", encoding="utf-8") as handle:
            cfg = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ModelConfigError("cannot read %s as JSON: %s" % (config_path, exc)) from None
    if not isinstance(cfg, dict):
        raise ModelConfigError("%s is not a JSON object" % config_path)
    return cfg, config_path, checkpoint_dir


# Fields a hub config may leave to its transformers class's defaults, by the language model's model_type (Gemma 3's
# multimodal configs give their text_config only what differs: Gemma3TextConfig's defaults fill the rest).
TEXT_CONFIG_DEFAULTS = {
    "gemma3_text": {"max_position_embeddings": 131072, "vocab_size": 262208, "sliding_window_pattern": 6},
}


def _language_config(cfg: dict) -> dict:
    """The language-model part of a (possibly multimodal) config; top-level keys fill what it lacks."""
    for key in ("text_config", "llm_config", "language_config"):
        nested = cfg.get(key)
        if isinstance(nested, dict) and nested:
            merged = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config", "audio_config")}
            merged.update(TEXT_CONFIG_DEFAULTS.get(str(nested.get("model_type")), {}))
            merged.update(nested)
            if "quantization_config" in cfg and "quantization_config" not in nested:
                merged["quantization_config"] = cfg["quantization_config"]
            return merged
    return cfg


def _quantization(cfg: dict) -> tuple:
    """(quant_method, bits per quantized weight incl. scales, weight_block_size)."""
    qcfg = cfg.get("quantization_config")
    if not isinstance(qcfg, dict):
        return None, 16.0, None
    method = str(qcfg.get("quant_method", "")).lower() or None
    block = qcfg.get("weight_block_size")
    block = tuple(block) if isinstance(block, list) else None
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return method, 8.0, block
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"):
        bits = float(qcfg.get("bits") or qcfg.get("w_bit") or 4)
        group = int(qcfg.get("group_size") or qcfg.get("q_group_size") or 128)
        # one fp16 scale and one packed zero point per group; group_size -1 means per output channel
        overhead = 32.0 / group if group > 0 else 0.0
        return method, bits + overhead, block
    if method == "compressed-tensors":
        bits = 8.0
        for group_cfg in (qcfg.get("config_groups") or {}).values():
            weights = group_cfg.get("weights") if isinstance(group_cfg, dict) else None
            if isinstance(weights, dict) and weights.get("num_bits"):
                bits = float(weights["num_bits"])
                break
        return method, bits, block
    if method == "mxfp4":
        return method, 4.25, block
    if method == "bitsandbytes":
        return method, 4.0 if qcfg.get("load_in_4bit") else 8.0, block
    return method, 16.0, block


# config.json layer_types spellings, by the KV kind vLLM gives the layer.
_FULL_TYPES = frozenset({"full_attention", "attention", "global_attention", "global"})
_SLIDING_TYPES = frozenset({"sliding_attention", "sliding_window_attention", "local_attention", "local"})
_STATE_TYPES = frozenset({"mamba", "mamba2", "linear_attention"})
# Nemotron-H's hybrid_override_pattern: M a Mamba2 layer, * attention, - an MLP, E an MoE block (neither caches).
_NEMOTRON_H_KINDS = {"M": "mamba", "*": "full", "-": "none", "E": "none"}


def _declared_layer_types(cfg: dict, model_type: str, num_layers: int) -> Optional[list]:
    """The config's per-layer types, or the ones transformers derives for the model types that do not list them."""
    declared = cfg.get("layer_types")
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if model_type == "nemotron_h" and isinstance(cfg.get("hybrid_override_pattern"), str):
        return list(cfg["hybrid_override_pattern"])
    if model_type in ("gemma3", "gemma3_text") and cfg.get("sliding_window"):
        # Gemma3TextConfig: every sliding_window_pattern-th layer is global
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    if model_type in ("gemma2", "gpt_oss") and cfg.get("sliding_window"):
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if model_type == "qwen3_next":
        interval = int(cfg.get("full_attention_interval") or 4)
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    return None


def _layer_kinds(cfg: dict, model_type: str, num_layers: int) -> tuple:
    """(layer_kinds, why they cannot be described): see ModelShape.layer_kinds."""
    declared = _declared_layer_types(cfg, model_type, num_layers)
    window = cfg.get("sliding_window")
    if declared is None:
        if model_type in NON_UNIFORM_MODEL_TYPES:
            return (), "model_type %s mixes attention kinds in a way the planner does not read" % model_type
        if window and cfg.get("use_sliding_window", True) is not False:
            return (), ("sliding_window %s with no layer_types: which layers use the window is not stated"
                        % window)
        return (), ""
    if len(declared) != num_layers:
        return (), "layer_types lists %d layers, num_hidden_layers says %d" % (len(declared), num_layers)
    kinds = []
    for layer_type in declared:
        if model_type == "nemotron_h" and layer_type in _NEMOTRON_H_KINDS:
            kinds.append(_NEMOTRON_H_KINDS[layer_type])
        elif layer_type in _FULL_TYPES:
            kinds.append("full")
        elif layer_type in _SLIDING_TYPES and isinstance(window, int) and window > 0:
            kinds.append("sliding:%d" % window)
        elif layer_type in _STATE_TYPES:
            kinds.append("mamba")
        else:
            return (), "layer type %r is not one the planner sizes" % layer_type
    return (tuple(kinds) if set(kinds) != {"full"} else ()), ""


def _mamba_state(cfg: dict, model_type: str) -> tuple:
    """ModelShape.mamba_state, from the fields vLLM's model class reads (get_mamba_state_shape_from_config)."""
    def get(name):
        value = cfg.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    if model_type == "qwen3_next":
        fields = (get("linear_conv_kernel_dim"), get("linear_num_key_heads"), get("linear_key_head_dim"),
                  get("linear_num_value_heads"), get("linear_value_head_dim"))
        return ("gated_delta_net",) + fields if None not in fields else ()
    if model_type == "nemotron_h":
        heads, head_dim = get("mamba_num_heads"), get("mamba_head_dim")
        fields = (get("conv_kernel"), heads * head_dim if heads and head_dim else None, get("n_groups"),
                  get("ssm_state_size"), heads, head_dim)
        return ("mamba2",) + fields if None not in fields else ()
    if model_type in ("granitemoehybrid", "bamba"):
        expand, hidden = get("mamba_expand"), get("hidden_size")
        fields = (get("mamba_d_conv"), expand * hidden if expand and hidden else None, get("mamba_n_groups"),
                  get("mamba_d_state"), get("mamba_n_heads"), get("mamba_d_head"))
        return ("mamba2",) + fields if None not in fields else ()
    return ()


# (modality, the most tokens one item becomes) by the checkpoint's model_type, with the family's published processor
# files: Qwen3-VL's preprocessor_config.json (longest_edge 16777216 pixels: a 4096 x 4096 image of 16 px patches
# merged 2 x 2) and video_preprocessor_config.json (25165824 over 2 frames: 3072 x 4096), as vLLM 0.26's
# Qwen3-VL processing info computes them; Gemma 3: 256 tokens an image (pan-and-scan off).
VISION_TOKENS_PER_ITEM = {
    "qwen3_vl": (("image", 16384), ("video", 12288)),
    "qwen3_vl_moe": (("image", 16384), ("video", 12288)),
    "gemma3": (("image", 256),),
}


def _vision_output_width(vision: Any, text_hidden: int) -> int:
    if not isinstance(vision, dict):
        return 0
    width = vision.get("out_hidden_size") or text_hidden
    return width * (1 + len(vision.get("deepstack_visual_indexes") or ()))


def vision_parameters(vision: Any, text_hidden: int) -> int:
    """Parameters of a ViT-style vision encoder from its vision_config (0 without one): per block attention (4 x
    width^2) and a two-matrix MLP; the patch embedding; the merger(s) that project merged patches to the text width
    (Qwen-VL: spatial_merge_size^2 patches a token; one merger per deepstack layer besides the last)."""
    if not isinstance(vision, dict):
        return 0
    width = vision.get("hidden_size") or vision.get("embed_dim") or 0
    depth = vision.get("depth") or vision.get("num_hidden_layers") or 0
    if not (isinstance(width, int) and isinstance(depth, int) and width > 0 and depth > 0):
        return 0
    inter = vision.get("intermediate_size") or 4 * width
    patch = vision.get("patch_size") or 14
    channels = vision.get("in_channels") or vision.get("num_channels") or 3
    temporal = vision.get("temporal_patch_size") or 1
    blocks = depth * (4 * width * width + 2 * width * inter)
    embed = channels * temporal * patch * patch * width + (vision.get("num_position_embeddings") or 0) * width
    merge = vision.get("spatial_merge_size") or 0
    mergers = 0
    if merge:
        merged = width * merge * merge
        out = vision.get("out_hidden_size") or text_hidden
        mergers = (1 + len(vision.get("deepstack_visual_indexes") or ())) * (merged * merged + merged * out)
    return blocks + embed + mergers


def _derived_max_model_len(cfg: dict, max_position_embeddings: int) -> tuple:
    """vLLM's derived max length: max_position_embeddings, stretched by a rope scaling factor where vLLM does so."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return max_position_embeddings, None
    rope_type = str(rope.get("rope_type") or rope.get("type") or "default")
    # llama3 / longrope / mrope configs already state the long length in max_position_embeddings.
    if rope_type in ("default", "llama3", "longrope", "su", "mrope") or "factor" not in rope:
        return max_position_embeddings, None if rope_type == "default" else rope_type
    base = max_position_embeddings
    if rope_type == "yarn":
        base = rope.get("original_max_position_embeddings") or max_position_embeddings
    return int(base * float(rope["factor"])), rope_type


def rope_cache_elements(lm: dict, model_type: str, head_dim: int, max_pos: int) -> int:
    """Elements of the cos/sin caches of vLLM's rotary embeddings (vllm/model_executor/layers/rotary_embedding, 0.26):
    get_rope makes one per distinct setting, each a [positions, rotary_dim] tensor in the model dtype at load, before
    the profile. Positions: max_position_embeddings; x the factor for linear and dynamic scaling; the original length
    x the factor for YaRN; x 4 for a multimodal rope (MRotaryEmbedding: "enlarge max_position_embeddings to 4 times"
    for video). Gemma 3's sliding layers have a second, unscaled one (rope_local_base_freq). 0 without rotary
    positions (Granite 4.0-H's NoPE)."""
    if str(lm.get("position_embedding_type") or "").lower() == "nope":
        return 0
    rope = lm.get("rope_scaling") or lm.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        rope = {}
    rotary_dim = _positive_int(lm, "config.json", ("qk_rope_head_dim",), required=False)
    if not rotary_dim:
        factor = lm.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
        rotary_dim = int(head_dim * float(factor))
    rope_type = str(rope.get("rope_type") or rope.get("type") or "default")
    scale = float(rope.get("factor") or 1.0)
    if "mrope_section" in rope:
        positions = max_pos * 4
    elif rope_type in ("linear", "dynamic"):
        positions = int(max_pos * scale)
    elif rope_type in ("yarn", "deepseek_yarn"):
        positions = int((rope.get("original_max_position_embeddings") or max_pos) * scale)
    else:
        positions = max_pos
    if model_type.startswith("gemma3"):  # its sliding layers' own rope (rope_local_base_freq, 10000 by default)
        positions += max_pos
    return positions * rotary_dim


def parse_config(cfg: dict, source: str = "config.json") -> ModelShape:
    """Turn a config.json dict into a ModelShape, or raise ModelConfigError naming the missing/bad field."""
    lm = _language_config(cfg)
    model_type = str(lm.get("model_type") or cfg.get("model_type") or "unknown")
    num_layers = _positive_int(lm, source, ("num_hidden_layers", "n_layer", "num_layers"))
    heads = _positive_int(lm, source, ("num_attention_heads", "n_head", "num_heads"))
    kv_heads = _positive_int(lm, source, ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"),
                             required=False, default=heads)
    hidden = _positive_int(lm, source, ("hidden_size", "n_embd", "d_model"))
    if num_layers == 0 or heads == 0 or kv_heads == 0:
        raise ModelConfigError("%s: num_hidden_layers, num_attention_heads and num_key_value_heads must be > 0" % source)
    head_dim = lm.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        head_dim = hidden // heads
    max_pos = _positive_int(lm, source, ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                                         "max_sequence_length"), required=False, default=0)
    if max_pos == 0:
        raise ModelConfigError("%s has no max_position_embeddings: set max_model_len explicitly or use a complete "
                               "config.json" % source)
    derived, rope_type = _derived_max_model_len(lm, max_pos)
    quant_method, bits, block = _quantization(lm)
    num_experts = _positive_int(lm, source, ("num_experts", "n_routed_experts", "num_local_experts"), required=False)
    moe_inter = _positive_int(lm, source, ("moe_intermediate_size",), required=False)
    intermediate = _positive_int(lm, source, ("intermediate_size", "ffn_hidden_size", "n_inner"), required=False,
                                 default=4 * hidden)
    if num_experts and not moe_inter:
        moe_inter = intermediate  # Mixtral spells the expert width intermediate_size
    shared_inter = _positive_int(lm, source, ("shared_expert_intermediate_size", "shared_intermediate_size"),
                                 required=False)
    if not shared_inter and lm.get("n_shared_experts"):
        shared_inter = int(lm["n_shared_experts"]) * moe_inter
    dense_layers = _positive_int(lm, source, ("first_k_dense_replace",), required=False)
    if num_experts and isinstance(lm.get("mlp_only_layers"), list):
        dense_layers += len(lm["mlp_only_layers"])
    kv_lora_rank = _positive_int(lm, source, ("kv_lora_rank",), required=False)
    dtype = str(lm.get("torch_dtype") or lm.get("dtype") or "bfloat16")
    layer_kinds, non_uniform = ((), "") if kv_lora_rank else _layer_kinds(lm, model_type, num_layers)
    mamba_state = _mamba_state(lm, model_type) if "mamba" in layer_kinds else ()
    if "mamba" in layer_kinds and not mamba_state:
        layer_kinds, non_uniform = (), "model_type %s has recurrent-state layers the planner does not size" % model_type
    if model_type == "nemotron_h" and head_dim == hidden // heads and isinstance(lm.get("attention_head_dim"), int):
        head_dim = lm["attention_head_dim"]
    return ModelShape(
        source=source,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=_positive_int(lm, source, ("vocab_size",), required=False, default=32000),
        max_position_embeddings=max_pos,
        derived_max_model_len=derived,
        rope_scaling_type=rope_type,
        # transformers' default where the config leaves it out: Gemma configs tie, the others do not
        tie_word_embeddings=bool(lm.get("tie_word_embeddings", model_type.startswith("gemma"))),
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=_positive_int(lm, source, ("qk_rope_head_dim",), required=False),
        qk_nope_head_dim=_positive_int(lm, source, ("qk_nope_head_dim",), required=False),
        v_head_dim=_positive_int(lm, source, ("v_head_dim",), required=False),
        q_lora_rank=_positive_int(lm, source, ("q_lora_rank",), required=False),
        num_experts=num_experts,
        num_experts_per_tok=_positive_int(lm, source, ("num_experts_per_tok", "experts_per_token",
                                                       "num_experts_per_token"), required=False),
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        num_dense_layers=dense_layers,
        quant_method=quant_method,
        weight_bits=bits,
        weight_block_size=block,
        non_uniform_reason=non_uniform,
        layer_kinds=layer_kinds,
        mamba_state=mamba_state,
        # vLLM's NemotronH config hook: the SSM state in fp32 unless the config names a dtype
        mamba_ssm_dtype_bytes=(_DTYPE_BYTES.get(str(lm.get("mamba_ssm_cache_dtype") or "float32"), 4)
                               if model_type == "nemotron_h" else 0),
        vision_parameters=vision_parameters(cfg.get("vision_config"), hidden),
        vision_tokens_per_item=VISION_TOKENS_PER_ITEM.get(str(cfg.get("model_type")), ()),
        vision_output_width=_vision_output_width(cfg.get("vision_config"), hidden),
        deepstack_levels=len((cfg.get("vision_config") or {}).get("deepstack_visual_indexes") or ()),
        rope_cache_elements=rope_cache_elements(lm, model_type, head_dim, max_pos),
        extra={"dtype_bytes": _DTYPE_BYTES.get(dtype, 2)},
    )


def safetensors_tensor_bytes(handle, what: str) -> int:
    """Bytes of tensor data in one .safetensors file (an open binary handle at its start), from its JSON header only."""
    raw = handle.read(8)
    if len(raw) != 8:
        raise ModelConfigError("%s is not a safetensors file (short header)" % what)
    (header_len,) = struct.unpack("<Q", raw)
    if header_len > 100 * 1024 * 1024:
        raise ModelConfigError("%s: safetensors header of %d bytes is implausible" % (what, header_len))
    header = json.loads(handle.read(header_len))
    total = 0
    for name, meta in header.items():
        if name != "__metadata__" and isinstance(meta, dict):
            start, end = meta["data_offsets"]
            total += end - start
    return total


def _safetensors_header_bytes(path: str) -> int:
    with open(path, "rb") as handle:
        return safetensors_tensor_bytes(handle, path)


def checkpoint_weight_bytes(checkpoint_dir: str) -> Optional[int]:
    """Total tensor bytes of the checkpoint's safetensors, or None when there are none to look at."""
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, "r", encoding="utf-8") as handle:
                total = (json.load(handle).get("metadata") or {}).get("total_size")
            if isinstance(total, int) and total > 0:
                return total
        except (OSError, ValueError):
            pass
    try:
        names = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith(".safetensors"))
    except OSError:
        return None
    if not names:
        return None
    return sum(_safetensors_header_bytes(os.path.join(checkpoint_dir, n)) for n in names)


def load_model_shape(path: str) -> ModelShape:
    """Read a config.json (file, checkpoint dir, HF cache repo or snapshot) plus its safetensors size if present."""
    cfg, config_path, checkpoint_dir = load_config_dict(path)
    return shape_with_weights(cfg, config_path, checkpoint_weight_bytes(checkpoint_dir))


def shape_with_weights(cfg: dict, source: str, weight_bytes: Optional[int]) -> ModelShape:
    """parse_config, with the checkpoint's weight size where it is known (else the size the config implies)."""
    if not isinstance(cfg, dict):
        raise ModelConfigError("%s is not a JSON object" % source)
    shape = parse_config(cfg, source=source)
    if weight_bytes is None:
        return shape
    values = dict(shape.__dict__)
    values["checkpoint_bytes"] = weight_bytes
    return ModelShape(**values)
