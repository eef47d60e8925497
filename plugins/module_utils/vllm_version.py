# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A vLLM release as its image tag names it (v0.32.0, 0.32.0, v0.32.0-cu129, v0.11.0rc1): the one parser of it, for
the flags rendered per release (vllm_args), the settings check (vllm_settings), the image's CUDA (image_compat) and
the KV planner (kv_cache)."""
from __future__ import annotations

import re

_RELEASE_RE = re.compile(r"^[vV]?(\d+)\.(\d+)\.(\d+)(.*)$")


def parse_tag(text):
    """'v0.32.0-cu129' -> ((0, 32, 0), '-cu129'); None for what is not a release tag."""
    match = _RELEASE_RE.match(str(text if text is not None else "").strip())
    if not match:
        return None
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))), match.group(4)


def parse(text):
    """'v0.32.0', '0.32.0', 'v0.32.0-lab2' -> (0, 32, 0); None for what is not a release."""
    found = parse_tag(text)
    return found[0] if found else None
