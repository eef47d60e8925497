# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a copy of a model-configs folder with fewer decoder layers, for short compiled startups (kv_startups.sh).

    python3 benchmarks/gpu_compare/cut_layers.py SRC_DIR LAYERS DST_DIR

Only the layer count changes: `num_hidden_layers` (a vision-language model's `text_config` one) becomes LAYERS and
an explicit `layer_types` list keeps its first LAYERS entries, so a hybrid keeps its pattern (Gemma 3's
`sliding_window_pattern`, Qwen3-Next's `full_attention_interval` follow from the count). Every other file of the
folder (processor files, QWEN_TOKEN_LAYOUT) is copied unchanged. The planner reads the cut config like any other.
"""
import json
import shutil
import sys
from pathlib import Path


def cut(src: Path, layers: int, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name != "config.json":
            shutil.copy(item, dst / item.name)
    config = json.loads((src / "config.json").read_text())
    text = config.get("text_config", config)
    if layers > text["num_hidden_layers"]:
        raise SystemExit("%s has %d layers, fewer than %d" % (src, text["num_hidden_layers"], layers))
    text["num_hidden_layers"] = layers
    if isinstance(text.get("layer_types"), list):
        text["layer_types"] = text["layer_types"][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    cut(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
