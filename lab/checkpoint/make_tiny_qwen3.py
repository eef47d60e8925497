# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate the lab's tiny Qwen3-architecture checkpoint, deterministically, with no hub.

Runs INSIDE the lab serving image (it has torch, transformers, tokenizers, safetensors), so the host needs no torch:

  docker run --rm --entrypoint python -v $PWD/lab/checkpoint:/gen:ro -v OUT:/out vllm/vllm-openai:v0.32.0 \
      /gen/make_tiny_qwen3.py --out /out

Writes a flat folder of files (config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json). --hidden, --layers and --seed make another model of the same family (the lab's embedding
model: lab/build_artifacts.py's MODELS); the defaults make onprem-lab/tiny-qwen3. lab/build_artifacts.py lays them
out as a Hugging Face cache repo (blobs/snapshots/refs).
Same recipe + same image -> same bytes (checked by generating twice).

The shape follows what vLLM's CPU build accepts: head_dim 64 (CPU attention rejects 16).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

SEED = 20261129
HIDDEN = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 512
MAX_POSITIONS = 4096
TARGET_VOCAB = 4096
CORPUS_DIRS = ["/usr/share/common-licenses"]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's ChatML template, reduced to what a text-only lab model needs.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def dump_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def corpus_files() -> list[str]:
    files = []
    for folder in CORPUS_DIRS:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    files.append(path)
    return sorted(files)


def train_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    files = corpus_files()
    if not files:
        raise SystemExit(f"no training text found under {CORPUS_DIRS}")
    tok.train(files, trainer)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for t, i in ids.items()}
    dump_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
    })
    return tok.get_vocab_size()


def seeded_tensors(shapes: dict, seed: int) -> dict:
    """bfloat16 tensors of these shapes: norms' weights 1, biases 0, the rest N(0, 0.02) from one seeded generator in
    sorted-name order; lm_head is left out (tied to embed_tokens)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        if name == "lm_head.weight":
            continue
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
            value = torch.ones(shapes[name], dtype=torch.float32)
        elif name.endswith(".bias"):
            value = torch.zeros(shapes[name], dtype=torch.float32)
        else:
            value = torch.randn(shapes[name], generator=gen, dtype=torch.float32) * 0.02
        tensors[name] = value.to(torch.bfloat16).contiguous()
    return tensors


def write_model(out: Path, tokenizer_vocab: int, hidden: int = HIDDEN, layers: int = LAYERS, seed: int = SEED) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = -(-tokenizer_vocab // 64) * 64  # pad to a multiple of 64, like real checkpoints
    eos, pad = SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE * hidden // HIDDEN,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": layers,
        "num_attention_heads": HEADS,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }
    dump_json(out / "config.json", config)
    dump_json(out / "generation_config.json", {
        "bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad,
        "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
    })
    # The parameter names and shapes come from transformers' own Qwen3 class (what vLLM's loader expects); the
    # values come from one seeded generator in sorted-name order, independent of transformers' init code.
    torch.manual_seed(seed)
    hf_config = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")})
    shapes = {name: tuple(t.shape) for name, t in Qwen3ForCausalLM(hf_config).state_dict().items()}
    tensors = seeded_tensors(shapes, seed)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    params = sum(t.numel() for t in tensors.values())
    return {"vocab_size": vocab, "parameters": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size (a multiple of %d)" % (HIDDEN // 4))
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer_vocab = train_tokenizer(args.out)
    info = write_model(args.out, tokenizer_vocab, hidden=args.hidden, layers=args.layers, seed=args.seed)
    print(json.dumps({"tokenizer_vocab": tokenizer_vocab, **info}))


if __name__ == "__main__":
    main()
