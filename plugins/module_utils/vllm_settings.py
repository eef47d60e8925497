# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vLLM server's numeric and string settings, checked before any host changes.

One function, used by the plan check (roles/plan_check), the rollout's own preflight (playbooks/tasks/rollout_checks.yml)
and vllm_server's validate step, through the onprem.vllm.vllm_settings_errors filter. It returns one message per bad
value, each naming the variable, what it got and what to set, so one run lists every mistake at once.
"""
from __future__ import annotations

import re

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_version

# Where the container sees the host's HF cache (roles/vllm_server/vars/main.yml mounts it there).
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
TAG_EXAMPLE = "v0.32.0"
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

# Settings vLLM may leave at its own default (None or ""), and those that must always be set.
OPTIONAL_COUNTS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens")
REQUIRED_COUNTS = ("tensor_parallel_size", "pipeline_parallel_size")


def as_count(value):
    """An integer >= 1 from an int or a string of digits (extra vars arrive as strings); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 1 else None
    if isinstance(value, str) and re.fullmatch(r"\s*\+?[0-9]+\s*", value):
        number = int(value)
        return number if number >= 1 else None
    return None


def as_fraction(value):
    """A float in (0, 1], or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= 1 else None


def _name(prefix: str, key: str) -> str:
    return f"{prefix}{key}"


def settings_errors(settings: dict, prefix: str = "vllm_server_") -> list[str]:
    """Every problem with the settings (keys without the prefix), as messages naming the inventory variable.

    Keys looked at when present: image_tag, image_digest, model, served_model_name, port, gpu_memory_utilization,
    tensor_parallel_size, pipeline_parallel_size, max_model_len, max_num_seqs, max_num_batched_tokens.
    """
    errors = []
    if "image_tag" in settings:
        tag = settings["image_tag"]
        if not isinstance(tag, str) or not tag.strip() or tag == "latest" or vllm_version.parse(tag) is None:
            errors.append(f"{_name(prefix, 'image_tag')} must pin a release: pin a tag like {TAG_EXAMPLE} (got "
                          f"{tag!r}; 'latest' or an empty tag changes under you and cannot be rolled back to).")
    digest = settings.get("image_digest")
    if digest and not (isinstance(digest, str) and _DIGEST_RE.match(digest)):
        errors.append(f"{_name(prefix, 'image_digest')} must look like sha256:<64 hex> or be empty (got {digest!r}).")
    for key in REQUIRED_COUNTS + OPTIONAL_COUNTS:
        if key not in settings:
            continue
        value = settings[key]
        if key in OPTIONAL_COUNTS and (value is None or value == ""):
            continue
        if as_count(value) is None:
            errors.append(f"{_name(prefix, key)} must be a whole number >= 1 (got {value!r})"
                          + (": leave it empty for vLLM's default." if key in OPTIONAL_COUNTS else "."))
    if "port" in settings:
        port = as_count(settings["port"])
        if port is None or port > 65535:
            errors.append(f"{_name(prefix, 'port')} must be a TCP port 1..65535 (got {settings['port']!r}).")
    if "gpu_memory_utilization" in settings and as_fraction(settings["gpu_memory_utilization"]) is None:
        errors.append(f"{_name(prefix, 'gpu_memory_utilization')} must be a fraction in (0, 1], such as 0.9 (got "
                      f"{settings['gpu_memory_utilization']!r}).")
    if "served_model_name" in settings:
        name = settings["served_model_name"]
        if not isinstance(name, str) or not name or re.search(r"\s", name):
            errors.append(f"{_name(prefix, 'served_model_name')} must be a non-empty name without spaces, which "
                          f"clients send as \"model\" (got {name!r}).")
    if "model" in settings:
        errors.extend(_model_errors(settings["model"], prefix))
    return errors


def _model_errors(model, prefix: str) -> list[str]:
    key = _name(prefix, "model")
    if not isinstance(model, str) or not model.strip() or re.search(r"\s", model):
        return [f"{key} must be a Hugging Face id (org/name) or a path inside the container, without spaces (got "
                f"{model!r})."]
    if model.startswith("/"):
        # Only the HF cache is mounted: any other path does not exist inside the container.
        normalized = "/" + "/".join(part for part in model.split("/") if part and part != ".")
        if ".." in model.split("/") or not normalized.startswith(CONTAINER_HF_CACHE + "/"):
            return [f"{key} is the path {model!r}, which the server's container does not have: only the HF cache "
                    f"is mounted, at {CONTAINER_HF_CACHE}. Put the model under the host's HF cache directory "
                    f"({prefix}hf_cache_path) and name it {CONTAINER_HF_CACHE}/<its path there>, or use its "
                    f"Hugging Face id."]
    return []
