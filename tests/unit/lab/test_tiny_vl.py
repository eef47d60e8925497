# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's vision-language checkpoint (onprem-lab/tiny-vl, lab/checkpoint/make_tiny_qwen3_vl.py) served by the lab's
vLLM (the CPU build, lab/serving-image) and asked about photos by the real OpenAI client (inside the serving image):
PNGs of 0.1, 2 and 8 MB as base64 data URLs, in the client's own key order (openai 3.63.0 writes model first),
streaming and not.

The image tokens prove the photo reached the vision tower: the processor resizes each image to multiples of 32
pixels (patch 16, merged 2 x 2) within its pixel budget (448 x 448), so the 0.1 MB photo (187 x 187) is 6 x 6 = 36
tokens and the 2 and 8 MB ones 14 x 14 = 196, each between a vision start and end token.

The known-answer gate's prompt set for this model (module_utils/known_answers.py) holds its fixed image prompt, and the
same server answers it the same way twice.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import time
import types
import urllib.request

import pytest
import yaml

from ansible_collections.onprem.vllm.plugins.module_utils import known_answers

pytestmark = [pytest.mark.needs_docker, pytest.mark.needs_lab_share]

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHARE = os.path.join(ROOT, "lab", "build", "share")
MODEL = "onprem-lab/tiny-vl"
with open(os.path.join(ROOT, "inventories", "example", "group_vars", "all", "plan.yml")) as _plan:
    _PLAN = yaml.safe_load(_plan)
    SERVING_IMAGE = "%s:%s" % (_PLAN["onprem_vllm_image"], _PLAN["onprem_vllm_image_tag"])

CLIENT = r'''
import base64, io, json, random
from openai import OpenAI
from PIL import Image

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")


def photo(megabytes):
    """A PNG of about that size: noise does not compress."""
    side = int((megabytes * 1024 * 1024 / 3) ** 0.5)
    pixels = random.Random(side).randbytes(side * side * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(buffer, "PNG")
    return side, buffer.getvalue()


def ask(content, stream):
    messages = [{"role": "user", "content": content}]
    if stream:
        chunks = client.chat.completions.create(model="tiny-vl", messages=messages, max_tokens=8, stream=True,
                                                stream_options={"include_usage": True})
        text, usage = "", None
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage.prompt_tokens
        return text, usage
    answer = client.chat.completions.create(model="tiny-vl", messages=messages, max_tokens=8)
    return answer.choices[0].message.content, answer.usage.prompt_tokens


question = {"type": "text", "text": "What is in this photo?"}
results = {"text": ask([question], False)}
for megabytes in (0.1, 2, 8):
    side, data = photo(megabytes)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    for stream in (False, True):
        text, prompt_tokens = ask([{"type": "image_url", "image_url": {"url": url}}, question], stream)
        results["%s MB%s" % (megabytes, " streamed" if stream else "")] = {
            "side": side, "png_bytes": len(data), "url_bytes": len(url), "text": text, "prompt_tokens": prompt_tokens}
print(json.dumps(results))
'''


def _docker(*args, check=True, timeout=120):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_vl_server(free_port):
    """(container name, published port) of the lab's vLLM serving tiny-vl, one server for the module's tests."""
    repos = glob.glob(os.path.join(SHARE, "hf-seed", "hub", "models--onprem-lab--tiny-vl", "snapshots", "*"))
    assert repos, "the lab share has no %s checkpoint (make lab-artifacts)" % MODEL
    name = "onprem-test-tiny-vl-%d" % os.getpid()
    port = free_port()
    _docker("run", "-d", "--name", name, "--shm-size", "1g", "-e", "VLLM_CPU_KVCACHE_SPACE=1",
            "-v", "%s:/root/.cache/huggingface:ro" % os.path.join(SHARE, "hf-seed"),
            "-p", "127.0.0.1:%d:8000" % port, SERVING_IMAGE, MODEL, "--served-model-name", "tiny-vl",
            "--max-model-len", "2048", "--limit-mm-per-prompt", json.dumps({"image": 1, "video": 0}))
    try:
        deadline = time.monotonic() + 420
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5)
                break
            except OSError:
                state = _docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip()
                logs = _docker("logs", "--tail", "40", name, check=False)
                assert state == "true", "the server exited: %s" % (logs.stdout + logs.stderr)[-4000:]
                assert time.monotonic() < deadline, "no /health in 420 s: %s" % (logs.stdout + logs.stderr)[-4000:]
                time.sleep(3)
        yield name, port
    finally:
        _docker("rm", "-f", "-v", name, check=False)


def test_the_openai_client_asks_the_lab_vision_model_about_photos_of_every_size(tiny_vl_server):
    proc = _docker("exec", "-i", tiny_vl_server[0], "python", "-c", CLIENT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    text_only = results.pop("text")[1]
    for label, result in results.items():
        assert result["text"], "%s: no answer" % label
        assert result["png_bytes"] >= float(label.split()[0]) * 0.9 * 1024 * 1024, (label, result["png_bytes"])
        # the image's tokens and its vision start and end tokens
        tokens = 36 if label.startswith("0.1 ") else 196
        assert result["prompt_tokens"] == text_only + tokens + 2, (label, result, text_only)


def test_the_known_answer_gate_asks_the_lab_vision_model_its_image_prompt(tiny_vl_server):
    """The gate's prompt set for tiny-vl's config.json ends with the image prompt; the server answers every prompt with
    16 tokens and their logprobs, a second asking matches the first, and the picture reached the vision tower (its
    image tokens in vLLM's count of the prompt)."""
    port = tiny_vl_server[1]
    snapshot = glob.glob(os.path.join(SHARE, "hf-seed", "hub", "models--onprem-lab--tiny-vl", "snapshots", "*"))[0]
    with open(os.path.join(snapshot, "config.json")) as handle:
        prompts = known_answers.prompt_set(["The capital of France is"], "generate", json.load(handle))
    assert prompts[-1] == known_answers.IMAGE_PROMPT
    usage = []

    def http(method, path, body):
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method,
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            text = answer.read().decode()
        usage.append(json.loads(text)["usage"]["prompt_tokens"])
        return types.SimpleNamespace(status=200, body=text)
    first = known_answers.ask_all(http, "generate", "tiny-vl", prompts, 16, 5)
    second = known_answers.ask_all(http, "generate", "tiny-vl", prompts, 16, 5)
    assert all(len(answer["tokens"]) == 16 for answer in first), first
    assert known_answers.compare(first, second, prompts, positions=16, max_logprob_delta=0.5, tie_margin=0.5,
                                 min_cosine=0.995) == []
    # The image prompt against its question alone: the picture's 4 x 4 tokens (128 pixels a side, 32 a token) and
    # its vision start and end tokens.
    question = known_answers.IMAGE_PROMPT[len(known_answers.IMAGE_MARK):]
    usage.clear()
    http("POST", *known_answers.request("generate", "tiny-vl", known_answers.IMAGE_PROMPT, 1, 2))
    http("POST", *known_answers.request("generate", "tiny-vl", question, 1, 2))
    assert usage[0] - usage[1] == 16 + 2, usage
