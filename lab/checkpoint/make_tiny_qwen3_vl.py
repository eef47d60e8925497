# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate the lab's tiny vision-language checkpoint (onprem-lab/tiny-vl: Qwen3-VL's architecture), deterministically,
with no hub.

Runs INSIDE the lab serving image, as make_tiny_qwen3.py does (whose tokenizer recipe and text model it reuses):

  docker run --rm --entrypoint python -v $PWD/lab/checkpoint:/gen:ro -v OUT:/out vllm/vllm-openai:v0.32.0 \
      /gen/make_tiny_qwen3_vl.py --out /out

Writes config.json (Qwen3VLForConditionalGeneration: the tiny Qwen3 as its language model, a one-block vision
tower), generation_config.json, model.safetensors, the tokenizer with Qwen3-VL's vision tokens and a chat template
that places them, and the image and video processors' configs. Images are resized to at most MAX_PIXELS, so a phone
photo becomes at most (448 / 32)^2 = 196 tokens on the lab's CPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import make_tiny_qwen3 as text

SEED = 20261206
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH = 16
MERGE = 2
MAX_PIXELS = 448 * 448
MIN_PIXELS = 64 * 64
VISION_HIDDEN = 64
VISION_HEADS = 2
VISION_DEPTH = 2
# Qwen3-VL's interleaved multimodal rope splits the rotary half (head_dim / 2 = 32) over time, height and width in
# the published 24:20:20 proportion.
MROPE_SECTION = [12, 10, 10]
# Qwen3-VL's template reduced to text and images: each image item becomes its placeholder between the vision tokens.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' or 'video' in item %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def processor_config(kind: str) -> dict:
    common = {"patch_size": PATCH, "temporal_patch_size": 2, "merge_size": MERGE, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
              "size": {"longest_edge": MAX_PIXELS, "shortest_edge": MIN_PIXELS}}
    if kind == "image":
        return dict(common, image_processor_type="Qwen2VLImageProcessor")
    return dict(common, video_processor_type="Qwen3VLVideoProcessor")


def write_model(out: Path, tokenizer_vocab: int, ids: dict, seed: int = SEED) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    vocab = -(-tokenizer_vocab // 64) * 64
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    text_config = {
        "model_type": "qwen3_vl_text", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": pad,
        "eos_token_id": eos, "head_dim": text.HEAD_DIM, "hidden_act": "silu", "hidden_size": text.HIDDEN,
        "initializer_range": 0.02, "intermediate_size": text.INTERMEDIATE, "max_position_embeddings": text.MAX_POSITIONS,
        "num_attention_heads": text.HEADS, "num_hidden_layers": text.LAYERS, "num_key_value_heads": text.KV_HEADS,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_cache": True,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": MROPE_SECTION, "rope_type": "default"},
        "vocab_size": vocab, "dtype": "bfloat16",
    }
    vision_config = {
        "model_type": "qwen3_vl", "deepstack_visual_indexes": [0], "depth": VISION_DEPTH,
        "hidden_act": "gelu_pytorch_tanh", "hidden_size": VISION_HIDDEN, "in_channels": 3, "initializer_range": 0.02,
        "intermediate_size": 4 * VISION_HIDDEN, "num_heads": VISION_HEADS, "num_position_embeddings": 256,
        "out_hidden_size": text.HIDDEN, "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": 2,
    }
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "text_config": text_config, "vision_config": vision_config, "tie_word_embeddings": True, "dtype": "bfloat16",
    }
    text.dump_json(out / "config.json", config)
    text.dump_json(out / "generation_config.json", {
        "bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad,
        "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
    })
    text.dump_json(out / "preprocessor_config.json", processor_config("image"))
    text.dump_json(out / "video_preprocessor_config.json", processor_config("video"))
    torch.manual_seed(seed)
    hf_config = Qwen3VLConfig.from_dict({k: v for k, v in config.items() if k not in ("architectures", "dtype")})
    shapes = {name: tuple(t.shape) for name, t in Qwen3VLForConditionalGeneration(hf_config).state_dict().items()}
    tensors = text.seeded_tensors(shapes, seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return {"vocab_size": vocab, "parameters": sum(t.numel() for t in tensors.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text.SPECIAL_TOKENS = text.SPECIAL_TOKENS + VISION_TOKENS
    text.CHAT_TEMPLATE = CHAT_TEMPLATE
    tokenizer_vocab = text.train_tokenizer(args.out)
    tokenizer = json.loads((args.out / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {token["content"]: token["id"] for token in tokenizer["added_tokens"]}
    info = write_model(args.out, tokenizer_vocab, ids, seed=args.seed)
    print(json.dumps({"tokenizer_vocab": tokenizer_vocab, **info}))


if __name__ == "__main__":
    main()
