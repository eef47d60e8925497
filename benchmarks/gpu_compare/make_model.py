# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a random-weight checkpoint of a Qwen3 model's shape (0.6B: 28 layers, hidden 1024, 16 query / 8 KV heads of
128; 8B: 36 layers, hidden 4096, 32 / 8 heads) with the lab checkpoint's tokenizer, for benchmarking on a GPU with no
model hub. Random weights cost the server what real ones do per token; the text is noise, which --ignore-eos and a
fixed output length make irrelevant.

  python3 make_model.py TOKENIZER_DIR OUT_DIR [0.6b|8b]
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SEED = 20261130
SHAPES = {
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "max_window_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "max_window_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096},
}


def main(tokenizer_dir: str, out_dir: str, shape: str = "0.6b") -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src, out = Path(tokenizer_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / name, out / name)
    config = json.loads((src / "config.json").read_text())
    config.update(SHAPES[shape])
    torch.manual_seed(SEED)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(Qwen3Config(**config)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    print("wrote %s: %.0fM parameters, vocab %d" % (out, params / 1e6, config["vocab_size"]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
