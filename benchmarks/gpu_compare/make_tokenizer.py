# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a stand-in tokenizer with the Qwen2/Qwen3 token-id layout, for vLLM startups of Qwen vision-language
models with dummy weights on a machine with no model hub (kv_startups.sh).

Constructed, not Qwen's: a byte-level BPE whose first 256 ids are the byte alphabet, padded with filler tokens up to
id 151642, and Qwen's special tokens at their published ids (<|endoftext|> 151643 ... <|vision_start|> 151652,
<|image_pad|> 151655, <|video_pad|> 151656 ... </think> 151668). vLLM's multimodal profiling only needs the
placeholder tokens to map to the ids the model's config names (image_token_id, video_token_id, ...); the text of the
dummy prompt is never read. No merges: every byte is one token.

  python3 make_tokenizer.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

FIRST_SPECIAL_ID = 151643
# (content, special) in id order from 151643, as in Qwen2.5 / Qwen3 / Qwen3-VL tokenizer_config.json.
SPECIAL_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (the ByteLevel pre-tokenizer's alphabet)."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    shifted, extra = [], 0
    for value in range(256):
        if value in kept:
            shifted.append(chr(value))
        else:
            shifted.append(chr(256 + extra))
            extra += 1
    return shifted


def tokenizer_json() -> dict:
    vocab = {char: index for index, char in enumerate(byte_alphabet())}
    for index in range(len(vocab), FIRST_SPECIAL_ID):
        vocab["<filler_%d>" % index] = index
    added = [{"id": FIRST_SPECIAL_ID + offset, "content": content, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": special}
             for offset, (content, special) in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144, "errors": "replace",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(FIRST_SPECIAL_ID + offset): {
            "content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special} for offset, (content, special) in enumerate(SPECIAL_TOKENS)},
        "additional_special_tokens": [content for content, special in SPECIAL_TOKENS if special][1:],
    }


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
