# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render `vllm serve` arguments for a pinned vLLM version (pure; used by the vllm_args filter and its tests).

Only flags whose spelling or meaning changed across releases need version logic; everything else is passed as given.
"""
from __future__ import annotations

import json

from ansible_collections.onprem.vllm.plugins.module_utils.kv_cache import (
    CPU_KV_CACHE_MEMORY_FROM,
    KV_CACHE_MEMORY_FLAG_FROM,
    PlanInputError,
    parse_kv_cache_memory,
)
from ansible_collections.onprem.vllm.plugins.module_utils import vllm_version
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_flags import RELEASES
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_secret_args import key_flags

# Request logging: 0.10 turned it off by default (`--enable-log-requests` turns it on); `--disable-log-requests`
# was deprecated then and removed by 0.20 ("unrecognized arguments"). Before 0.10 we must pass it to keep
# prompts out of the logs.
REQUEST_LOGGING_OFF_BY_DEFAULT = (0, 10, 0)
# --runner pooling (embedding and rerank models) replaced --task embed in vLLM 0.10.1.
RUNNER_FLAG_FROM = (0, 10, 1)
# BooleanOptionalAction (`--no-enable-prefix-caching`) arrived with the V1 engine's defaults (prefix caching and
# chunked prefill on by default).
BOOLEAN_OPTIONAL_FLAGS = (0, 8, 0)
# 0.34 spells the negation of --enable-X as --disable-X (and of --disable-X as --enable-X): --no-enable-prefix-caching
# is gone (its `vllm serve --help=all`, tests/fixtures/vllm-help).
ENABLE_DISABLE_NEGATION_FROM = (0, 34, 0)

# Flags vLLM dropped: the release that removed each, and what to do instead (vLLM's release notes).
REPLACED_FLAGS = {
    "--disable-log-requests": ((0, 20, 0), "request logging is off by default since 0.10: drop it "
                                           "(--enable-log-requests turns it on)"),
}


def unknown_flag_errors(extra_args, version: tuple[int, int, int]) -> list[str]:
    """The flags of extra_args that the pinned release's `vllm serve` does not have, each with what to do: those
    REPLACED_FLAGS says it dropped, and for a release with a capture (plugins/module_utils/vllm_flags.py) any other
    flag it lacks."""
    release = RELEASES.get(tuple(version))
    errors = []
    for arg in extra_args:
        text = str(arg)
        if not text.startswith("--"):
            continue
        flag = text.split("=", 1)[0].replace("_", "-")  # vLLM's parser reads --max_model_len as --max-model-len
        removed_in, instead = REPLACED_FLAGS.get(flag, (None, ""))
        if release is not None and flag in release["flags"]:
            continue
        if removed_in is not None and tuple(version) >= removed_in:
            hint = "removed in %s; %s" % (".".join(map(str, removed_in)), instead)
        elif release is None:
            continue
        else:
            had = [".".join(map(str, v)) for v, data in sorted(RELEASES.items()) if flag in data["flags"]]
            hint = ("vLLM %s had it: drop it or find its successor in the release notes" % ", ".join(had) if had
                    else "check its spelling in `vllm serve --help=all`")
        errors.append("vllm_server_extra_args has %s, which vLLM %s's `vllm serve` does not have (%s)"
                      % (flag, ".".join(map(str, version)), hint))
    return errors


class VllmArgsError(ValueError):
    """A setting that cannot be rendered; the message names it."""


def parse_version(version: str) -> tuple[int, int, int]:
    """'v0.32.0', '0.32.0', 'v0.32.0-lab2' → (0, 32, 0)."""
    parsed = vllm_version.parse(version)
    if parsed is None:
        raise VllmArgsError(f"vllm version {version!r} is not of the form vX.Y.Z (pin an image tag like v0.32.0)")
    return parsed


def _bool_flag(name: str, value: bool | None, version: tuple[int, int, int]) -> list[str]:
    if value is None:
        return []
    if value:
        return [f"--{name}"]
    if version >= ENABLE_DISABLE_NEGATION_FROM:
        if name.startswith("enable-"):
            return ["--disable-" + name[len("enable-"):]]
        if name.startswith("disable-"):
            return ["--enable-" + name[len("disable-"):]]
    if version >= BOOLEAN_OPTIONAL_FLAGS:
        return [f"--no-{name}"]
    return []  # older releases: off is the default and has no flag


def kv_cache_memory_args(setting, planned, cpu_mode: bool, version: tuple[int, int, int]) -> list[str]:
    """`--kv-cache-memory-bytes N` for the kv_cache_memory setting: '' (none), 'auto' (the plan's pool, `planned`)
    or bytes. On the CPU backend `auto` renders nothing: VLLM_CPU_KVCACHE_SPACE, which the plan used, pins the pool."""
    try:
        pinned = parse_kv_cache_memory(setting)
    except PlanInputError as exc:
        raise VllmArgsError("vllm_server_" + str(exc)) from exc
    if pinned is None or (cpu_mode and pinned == "auto"):
        return []
    need = CPU_KV_CACHE_MEMORY_FROM if cpu_mode else KV_CACHE_MEMORY_FLAG_FROM
    if version < need:
        raise VllmArgsError("vllm_server_kv_cache_memory needs vLLM %s or later (--kv-cache-memory-bytes%s); the "
                            "pinned version is %s: unset it or pin a newer image"
                            % (".".join(map(str, need)), " on the CPU backend" if cpu_mode else "",
                               ".".join(map(str, version))))
    if pinned == "auto":
        planned_text = str(planned if planned is not None else "").strip()
        if not planned_text.isdigit() or int(planned_text) < 1:
            raise VllmArgsError("vllm_server_kv_cache_memory is auto, but no KV plan with a pool reached the role "
                                "(vllm_server_kv_plan.kv_cache_memory_bytes is %r): deploy through site.yml or "
                                "playbooks/rollout.yml, whose preflight plans it, or give the bytes" % (planned,))
        pinned = int(planned_text)
    return ["--kv-cache-memory-bytes", str(pinned)]


def render_serve_args(settings: dict, version: str) -> list[str]:
    """Turn the vllm_server role's settings into the container's argument list.

    settings keys (None or missing = leave vLLM's default): model (required), revision, served_model_name (with
    served_model_aliases, more names it answers to), runner (generate: vLLM's default; pooling), port,
    tensor_parallel_size, pipeline_parallel_size, max_model_len, gpu_memory_utilization, max_num_batched_tokens,
    max_num_seqs, kv_cache_dtype, enable_chunked_prefill, enable_prefix_caching, enable_expert_parallel,
    disable_custom_all_reduce, enforce_eager, kv_cache_memory ('' / 'auto' / bytes) with kv_cache_memory_planned
    (the plan's pool for 'auto') and cpu_mode, limit_mm_per_prompt ({modality: count}), extra_args (list, appended
    last).
    """
    parsed = parse_version(version)
    model = settings.get("model")
    if not model:
        raise VllmArgsError("model is required (an HF repo id such as Qwen/Qwen3-30B-A3B-FP8, or a path)")
    # --model works with both the `vllm serve` entrypoint (0.8+) and the older api_server entrypoint.
    args = ["--model", str(model)]
    valued = [
        ("port", "--port"),
        ("tensor_parallel_size", "--tensor-parallel-size"),
        ("pipeline_parallel_size", "--pipeline-parallel-size"),
        ("max_model_len", "--max-model-len"),
        ("gpu_memory_utilization", "--gpu-memory-utilization"),
        ("max_num_batched_tokens", "--max-num-batched-tokens"),
        ("max_num_seqs", "--max-num-seqs"),
    ]
    if settings.get("revision"):
        args += ["--revision", str(settings["revision"])]
    served = [str(name) for name in [settings.get("served_model_name")] + list(settings.get("served_model_aliases") or [])
              if name]
    if served:
        args += ["--served-model-name"] + [name for index, name in enumerate(served) if name not in served[:index]]
    runner = settings.get("runner") or "generate"
    if runner == "pooling":
        args += ["--runner", "pooling"] if parsed >= RUNNER_FLAG_FROM else ["--task", "embed"]
    elif runner != "generate":
        raise VllmArgsError(f"runner must be generate or pooling, got {runner!r}")
    for key, flag in valued:
        value = settings.get(key)
        if value is not None and value != "":
            args += [flag, str(value)]
    args += kv_cache_memory_args(settings.get("kv_cache_memory"), settings.get("kv_cache_memory_planned"),
                                 str(settings.get("cpu_mode")).strip().lower() in ("true", "1", "yes"), parsed)
    kv_dtype = settings.get("kv_cache_dtype")
    if kv_dtype and kv_dtype != "auto":
        args += ["--kv-cache-dtype", str(kv_dtype)]
    args += _bool_flag("enable-chunked-prefill", settings.get("enable_chunked_prefill"), parsed)
    args += _bool_flag("enable-prefix-caching", settings.get("enable_prefix_caching"), parsed)
    if settings.get("enable_expert_parallel"):
        args.append("--enable-expert-parallel")
    if settings.get("disable_custom_all_reduce"):
        args.append("--disable-custom-all-reduce")
    if settings.get("enforce_eager"):
        args.append("--enforce-eager")
    limits = settings.get("limit_mm_per_prompt")
    if limits:
        # vLLM's JSON form ({"image": 2, "video": 0}), sorted so the container's arguments do not change
        counts = {str(name): int(count) for name, count in sorted(limits.items())}
        args += ["--limit-mm-per-prompt", json.dumps(counts, separators=(",", ":"))]
    if parsed < REQUEST_LOGGING_OFF_BY_DEFAULT:
        args.append("--disable-log-requests")
    extra = list(settings.get("extra_args") or [])
    if key_flags(extra):
        raise VllmArgsError(f"extra_args must not carry the API key flag ({', '.join(key_flags(extra))}): process "
                            "arguments are visible to every user of the host; set vllm_server_api_key (from Vault)")
    unknown = unknown_flag_errors(extra, parsed)
    if unknown:
        raise VllmArgsError("; ".join(unknown))
    return args + [str(arg) for arg in extra]
