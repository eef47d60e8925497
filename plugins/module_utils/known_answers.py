# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The known-answer gate: a fixed prompt set answered greedily, compared with the answers recorded the first time the
same model, revision and dtype passed it on this host.

A health gate proves a server starts and returns a token; it cannot see a server that answers wrongly (a kernel path
that changed the numerics, a broken all-reduce, a wrong tokenizer or chat template, other weights under the same
name). Here each prompt is answered with greedy decoding and the logprobs of the top tokens, and compared position by
position with the recorded answer:

- the token at each of the first `positions` positions must be the recorded one, and its logprob within
  `max_logprob_delta` of the recorded logprob;
- except a flip to a token the recording had within `tie_margin` of its best, observed at about the logprob the
  recording gave it: vLLM is not batch invariant (a prompt's logits depend slightly on what else is in the batch, on
  chunked prefill and on the kernel chosen for the batch size), so a near tie may flip between runs of the same
  server. From such a flip on, the rest of that answer is conditioned on another prefix and is not compared;
- a non-finite logprob (NaN, infinity) always fails.

Pooling servers (embeddings) compare each prompt's embedding with the recorded one by cosine similarity. A
vision-language model (its config.json has a vision_config) that accepts images also answers IMAGE_PROMPT about a
fixed picture made here (four coloured squares): the vision tower, the image processor and the placeholder tokens of
the chat template are then gated like the language model.

Pure logic: HTTP is injected, so the module, the tests and the benchmark run the same code.
"""
from __future__ import annotations

import base64
import json
import math
import struct
import zlib

# Short prompts of different kinds (fact, code, list, translation, arithmetic): a model's first tokens on each are
# stable under greedy decoding, and together they touch the tokenizer's common paths and the chat template.
DEFAULT_PROMPTS = (
    "The capital of France is",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three prime numbers greater than 10.",
    "Translate to German: good morning, how are you?",
    "What is 17 times 23?",
)
FORMAT = 1
# The image prompt's entry in a prompt set (and in the answers file's identity): the marker, then the question asked
# about the fixed picture. A changed picture or question is another prompt set, so answers are recorded again.
IMAGE_MARK = "<image: 128x128 PNG, four squares: red, green / blue, yellow> "
IMAGE_PROMPT = IMAGE_MARK + "Name the colours of the four squares in this picture, top left first."
IMAGE_SIDE = 128


class AnswersError(ValueError):
    """A server answer that cannot be read as one."""


def identity(model: str, revision: str, dtype: str, runner: str, prompts) -> dict:
    """What recorded answers are valid for: the same model, revision, dtype, runner and prompt set."""
    return {"format": FORMAT, "model": model, "revision": revision, "dtype": dtype, "runner": runner,
            "prompts": list(prompts)}


def checkpoint_dtype(config) -> str:
    """The checkpoint's dtype from its config.json (transformers writes torch_dtype, newer releases dtype)."""
    if not isinstance(config, dict):
        return "unknown"
    text = config.get("torch_dtype") or config.get("dtype") or (config.get("text_config") or {}).get("torch_dtype")
    return str(text) if text else "unknown"


def is_vision_language(config) -> bool:
    """Whether a checkpoint's config.json is a vision-language model's (Qwen2.5-VL, Qwen3-VL, gemma 3, ...)."""
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def picture_png(side: int = IMAGE_SIDE) -> bytes:
    """The image prompt's picture: a PNG of four flat squares (red, green on top; blue, yellow below), the same bytes
    on every host and release (no image library: zlib at a fixed level)."""
    half = side // 2
    colours = ((255, 0, 0), (0, 160, 0), (0, 0, 255), (255, 220, 0))
    rows = []
    for y in range(side):
        left, right = colours[0:2] if y < half else colours[2:4]
        rows.append(b"\x00" + bytes(left) * half + bytes(right) * (side - half))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
            + chunk(b"IEND", b""))


def prompt_set(prompts, runner: str, config, image_prompt: bool = True) -> list:
    """The prompts a server is gated on: the deployment's own (or DEFAULT_PROMPTS), plus IMAGE_PROMPT for a
    vision-language model on the generate runner unless images are off for it (image_prompt false:
    limit_mm_per_prompt's image is 0)."""
    result = list(prompts) or list(DEFAULT_PROMPTS)
    if image_prompt and runner == "generate" and is_vision_language(config) and IMAGE_PROMPT not in result:
        result.append(IMAGE_PROMPT)
    return result


def request(runner: str, served_model_name: str, prompt: str, positions: int, top_logprobs: int) -> tuple:
    """(path, body) of one prompt's request."""
    if runner == "pooling":
        return "/v1/embeddings", {"model": served_model_name, "input": prompt}
    content = prompt
    if prompt.startswith(IMAGE_MARK):
        url = "data:image/png;base64," + base64.b64encode(picture_png()).decode("ascii")
        content = [{"type": "image_url", "image_url": {"url": url}},
                   {"type": "text", "text": prompt[len(IMAGE_MARK):]}]
    return "/v1/chat/completions", {
        "model": served_model_name, "messages": [{"role": "user", "content": content}],
        "max_tokens": positions, "temperature": 0, "seed": 0, "logprobs": True, "top_logprobs": max(top_logprobs, 2)}


def parse(runner: str, body: str) -> dict:
    """One answer from a server's response body: {tokens, logprobs, top} (top: each position's top tokens and their
    logprobs, best first), or {embedding}."""
    try:
        data = json.loads(body)
        if runner == "pooling":
            return {"embedding": [float(x) for x in data["data"][0]["embedding"]]}
        content = data["choices"][0]["logprobs"]["content"]
        return {"tokens": [position["token"] for position in content],
                "logprobs": [float(position["logprob"]) for position in content],
                "top": [sorted(([t["token"], float(t["logprob"])] for t in position.get("top_logprobs") or []),
                               key=lambda pair: -pair[1]) for position in content]}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise AnswersError(f"no {'embedding' if runner == 'pooling' else 'logprobs'} in the answer "
                           f"({type(exc).__name__}: {exc}): {body[:300]}") from None


def margin(top: list):
    """The recording's top-1 minus top-2 logprob at a position (None when it holds fewer than two finite ones)."""
    values = [lp for _token, lp in top[:2]]
    return values[0] - values[1] if len(values) == 2 and all(map(math.isfinite, values)) else None


def ask_all(http, runner: str, served_model_name: str, prompts, positions: int, top_logprobs: int) -> list:
    """Each prompt's answer, one request at a time (a lone request: the least batch variance). http(method, path,
    body) -> object with .status and .body."""
    answers = []
    for prompt in prompts:
        path, body = request(runner, served_model_name, prompt, positions, top_logprobs)
        response = http("POST", path, body)
        if response.status != 200:
            # vLLM cannot put NaN or infinity into JSON: it answers 400 instead of the logprobs.
            if "Out of range float values" in response.body:
                raise AnswersError(f"prompt {prompt!r}: the server's logprobs are not finite (NaN or infinity; vLLM "
                                   f"answered HTTP {response.status}: {response.body[:200]})")
            raise AnswersError(f"prompt {prompt!r}: HTTP {response.status}: {response.body[:300]}")
        answers.append(parse(runner, response.body))
    return answers


def _cosine(a, b) -> float:
    if len(a) != len(b):
        return float("nan")
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm > 0 else float("nan")


def compare(recorded: list, observed: list, prompts, *, positions: int, max_logprob_delta: float, tie_margin: float,
            min_cosine: float) -> list:
    """Failures (one string per failing prompt, first failing position only); [] when every answer matches."""
    failures = []
    for prompt, rec, obs in zip(prompts, recorded, observed):
        if "embedding" in rec:
            cos = _cosine(rec["embedding"], obs.get("embedding", []))
            if not cos >= min_cosine:  # also NaN
                failures.append(f"prompt {prompt!r}: embedding cosine similarity {cos:.6f} < {min_cosine}")
            continue
        failure = _compare_tokens(rec, obs, positions, max_logprob_delta, tie_margin)
        if failure:
            failures.append(f"prompt {prompt!r}: {failure}")
    return failures


def _compare_tokens(rec: dict, obs: dict, positions: int, max_logprob_delta: float, tie_margin: float) -> str:
    for k in range(min(positions, len(rec["tokens"]))):
        if k >= len(obs["tokens"]):
            return f"the answer ends after {k} tokens, the recorded one has {len(rec['tokens'])}"
        token, logprob = obs["tokens"][k], obs["logprobs"][k]
        if not math.isfinite(logprob):
            return f"non-finite logprob {logprob} at position {k} (token {token!r})"
        if token != rec["tokens"][k]:
            # A flip is allowed only to a token the recording had within tie_margin of its best, at about the
            # logprob it had there; the rest of the answer then follows another prefix and is not compared.
            recorded = dict((t, lp) for t, lp in rec["top"][k])
            if token in recorded and rec["logprobs"][k] - recorded[token] < tie_margin \
                    and abs(logprob - recorded[token]) <= max_logprob_delta:
                return ""
            near = margin(rec["top"][k])
            return (f"first diverging token at position {k}: {token!r} (logprob {logprob:.4f}) instead of "
                    f"{rec['tokens'][k]!r} (recorded logprob {rec['logprobs'][k]:.4f}, recorded margin to the next "
                    f"{'unknown' if near is None else '%.4f' % near}, {token!r} recorded at "
                    f"{'%.4f' % recorded[token] if token in recorded else 'none of the top ' + str(len(recorded))}); "
                    f"answer so far {''.join(obs['tokens'][:k + 1])!r}, recorded {''.join(rec['tokens'][:k + 1])!r}")
        if abs(logprob - rec["logprobs"][k]) > max_logprob_delta:
            return (f"logprob of {token!r} at position {k} is {logprob:.4f}, recorded "
                    f"{rec['logprobs'][k]:.4f} (more than {max_logprob_delta} apart)")
    return ""


def non_finite(answers: list) -> str:
    """A non-finite value in fresh answers (nothing to compare with yet, but NaN is never an answer); '' if none."""
    for index, answer in enumerate(answers):
        values = answer.get("embedding") or answer.get("logprobs") or []
        bad = [v for v in values if not math.isfinite(v)]
        if bad:
            return f"answer {index} holds a non-finite value ({bad[0]})"
    return ""


def not_gated(stored, wanted: dict, mode: str) -> str:
    """Why a server's answers were recorded instead of compared, in words: such a server was not gated. STORED is the
    answers file's content (None when there is none), WANTED the identity the server claims (identity()). The file
    holds one identity's answers: those of another revision are replaced, so they gate nothing after this."""
    if mode == "accept":
        return "answers accepted as they are (mode accept): recorded now, not gated"
    had = stored.get("identity") if isinstance(stored, dict) else None
    if not isinstance(had, dict):
        return "no recorded answers on this host for %s: recorded now, not gated" % _describe(
            wanted, ("model", "revision"))
    keys = [k for k in ("model", "revision", "dtype", "runner") if had.get(k) != wanted[k]]
    if had.get("prompts") != wanted["prompts"]:
        keys.append("prompts")
    if had.get("format") != wanted["format"] or not keys:
        keys.append("format")
    return "no recorded answers for %s (this host's were for %s): recorded now, not gated" % (
        _describe(wanted, keys, "this prompt set"), _describe(had, keys, "another prompt set"))


def _describe(ident: dict, keys, prompts="this prompt set") -> str:
    words = {"prompts": prompts, "format": "answers format %s" % ident.get("format")}
    return ", ".join(words.get(k) or "%s %s" % (k, ident.get(k) or ("(none pinned)" if k == "revision" else "''"))
                     for k in keys)


def run(http, *, answers_file: str, model: str, revision: str, model_config, runner: str, served_model_name: str,
        prompts, positions: int, top_logprobs: int, max_logprob_delta: float, tie_margin: float, min_cosine: float,
        mode: str, image: str, read_json, write_json, now: str, image_prompt: bool = True) -> dict:
    """The gate on one server: {outcome, changed, failures, seconds, answers_file, note, error}. MODE gate (compare,
    record when nothing is recorded for this identity), record_missing (record only when nothing is recorded; a
    difference is reported, not a failure) or accept (record the answers as they are). NOTE says why answers were
    recorded instead of compared (outcome recorded: the server was not gated), '' otherwise. ERROR is the failure's
    message, '' when the gate passed.
    READ_JSON(path) -> parsed or None, WRITE_JSON(path, content) and NOW (a UTC timestamp) are the caller's I/O.
    IMAGE_PROMPT is among the prompts for a vision-language MODEL_CONFIG unless IMAGE_PROMPT (the flag) is false."""
    import time

    result = {"outcome": "", "changed": False, "failures": [], "seconds": 0.0, "answers_file": answers_file,
              "note": "", "error": ""}
    config = read_json(model_config) if model_config else None
    prompts = prompt_set(prompts, runner, config, image_prompt)
    stored = read_json(answers_file)
    wanted = identity(model, revision, checkpoint_dtype(config), runner, prompts)
    recorded = stored if stored and stored.get("identity") == wanted else None
    if mode == "record_missing" and recorded is not None:
        result["outcome"] = "kept"
        return result
    started = time.monotonic()
    try:
        answers = ask_all(http, runner, served_model_name, prompts, positions, top_logprobs)
    except (AnswersError, OSError) as exc:
        result.update(outcome="failed", error="known-answer gate: the server did not answer the prompt set: %s" % exc)
        return result
    result["seconds"] = round(time.monotonic() - started, 3)
    broken = non_finite(answers)
    if broken:
        result.update(outcome="failed", failures=[broken], error="known-answer gate failed: %s" % broken)
        return result
    if recorded is not None and mode != "accept":
        result["recorded_with"] = {"image": recorded.get("image", ""), "recorded_at": recorded.get("recorded_at", "")}
        failures = compare(recorded["answers"], answers, prompts, positions=positions,
                           max_logprob_delta=max_logprob_delta, tie_margin=tie_margin, min_cosine=min_cosine)
        result["failures"] = failures
        if not failures:
            result["outcome"] = "passed"
        elif mode == "record_missing":
            result["outcome"] = "differs"
        else:
            result.update(outcome="failed", error=(
                "known-answer gate failed on %d of %d prompts (answers recorded with %s at %s). First: %s. If the new "
                "answers are right (checked by a person), record them with vllm_server_known_answers_accept: true."
                % (len(failures), len(prompts), recorded.get("image") or "an unknown image",
                   recorded.get("recorded_at") or "an unknown time", failures[0])))
        return result
    write_json(answers_file, {"identity": wanted, "image": image, "answers": answers, "recorded_at": now})
    result.update(outcome="recorded", changed=True, note=not_gated(stored, wanted, mode))
    return result
