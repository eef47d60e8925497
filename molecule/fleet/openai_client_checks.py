# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's deployments through the gateway with the real OpenAI Python client, in its own key order.

Runs inside a container of the lab's vLLM image (it ships the openai package vLLM itself uses) on the fleet's network:
  python3 openai_client_checks.py BASE_URL CAFILE KEYFILE CHAT_MODEL EMBED_MODEL EMBED_DIMENSIONS VISION_MODEL
Prints one JSON object with each check's outcome; exits 1 when any check failed. The bodies over 64 KB are sent in the
client's own key order (this release writes "model" first; tests/unit/roles/test_gateway_routing.py also sends them
with "model" last, as other clients do). The vision-language deployment is asked about photos (noise PNGs of 0.1 and
2 MB, base64 image_url parts, plain and streamed): the prompt's token count proves the photo reached its vision tower
(the lab's tiny-vl: 36 image tokens for the 187-pixel photo and 196 for the larger one, each between a vision start
and end token; tests/unit/lab/test_tiny_vl.py), also with messages before model as other clients write it (the 2 MB
one beyond the gateway's buffer: routed by the gateway's model finder, plain and streamed); an 8 MB one (10.7 MB of
body) is over the example client's max_body_bytes: 413 in either key order.
"""
from __future__ import annotations

import base64
import io
import json
import random
import sys

import httpx
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from PIL import Image


def main(argv: list[str]) -> int:
    base_url, cafile, keyfile, chat_model, embed_model, dimensions, vision_model = argv
    with open(keyfile, encoding="utf-8") as handle:
        key = handle.read().strip()
    client = openai.OpenAI(base_url=base_url, api_key=key, http_client=httpx.Client(verify=cafile, timeout=120),
                           max_retries=0)
    results = {}

    def check(name, func):
        try:
            results[name] = {"ok": True, "detail": func()}
        except Exception as exc:  # every failure is reported, none stops the others
            results[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"[:400]}

    def chat():
        answer = client.chat.completions.create(model=chat_model, max_tokens=8,
                                                messages=[{"role": "user", "content": "Say hello."}])
        assert answer.model == chat_model and answer.usage.completion_tokens >= 1, answer
        return answer.choices[0].message.content

    def chat_stream():
        chunks = list(client.chat.completions.create(model=chat_model, max_tokens=8, stream=True,
                                                     messages=[{"role": "user", "content": "Count to three."}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(chunks) >= 2, chunks
        return f"{len(chunks)} chunks: {text!r}"

    def embeddings():
        answer = client.embeddings.create(model=embed_model, input=["hello", "world"])
        lengths = {len(item.embedding) for item in answer.data}
        assert len(answer.data) == 2 and lengths == {int(dimensions)}, lengths
        return f"2 embeddings of {int(dimensions)} numbers"

    def embeddings_over_64_kb():
        batch = [f"passage {n}: " + "the fleet serves several models behind one gateway. " * 2 for n in range(700)]
        size = len(json.dumps({"input": batch, "model": embed_model}))
        assert size > 65536, size
        answer = client.embeddings.create(model=embed_model, input=batch)
        assert len(answer.data) == len(batch)
        return f"{len(batch)} embeddings from a {size}-byte body"

    def chat_over_64_kb():
        # Longer than the tiny model's context: the answer must be vLLM's own refusal (the request reached the chat
        # deployment), not the gateway's 404 or 413.
        content = "Summarise: " + "a long retrieved passage about the fleet. " * 1800
        try:
            client.chat.completions.create(model=chat_model, max_tokens=4, messages=[{"role": "user", "content": content}])
        except openai.BadRequestError as exc:
            message = str(exc)
            assert "context" in message.lower() or "token" in message.lower(), message
            return f"routed to the chat deployment, which refused {len(content)} characters: {message[:120]}"
        return f"answered a {len(content)}-character prompt"

    def photo_url(megabytes):
        """A noise PNG of about that size (noise does not compress) as a base64 data URL."""
        side = int((megabytes * 1024 * 1024 / 3) ** 0.5)
        buffer = io.BytesIO()
        Image.frombytes("RGB", (side, side), random.Random(side).randbytes(side * side * 3)).save(buffer, "PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

    question = {"type": "text", "text": "What is in this photo?"}

    def ask_vision(content, stream=False):
        messages = [{"role": "user", "content": content}]
        if not stream:
            answer = client.chat.completions.create(model=vision_model, max_tokens=8, messages=messages)
            assert answer.model == vision_model and answer.choices[0].message.content, answer
            return answer.usage.prompt_tokens
        chunks = list(client.chat.completions.create(model=vision_model, max_tokens=8, messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks
        return next(c.usage.prompt_tokens for c in chunks if c.usage)

    def ask_vision_messages_first(content, stream=False):
        # The key order other clients write (messages, then model): a body beyond the gateway's buffer is routed by
        # the gateway's model finder.
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
        if not stream:
            answer = client.post("/chat/completions", cast_to=ChatCompletion, body=dict(body, model=vision_model))
            assert answer.model == vision_model and answer.choices[0].message.content, answer
            return answer.usage.prompt_tokens
        chunks = list(client.post("/chat/completions", cast_to=ChatCompletion, stream=True,
                                  stream_cls=openai.Stream[ChatCompletionChunk],
                                  body=dict(body, stream=True, stream_options={"include_usage": True},
                                            model=vision_model)))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks
        return next(c.usage.prompt_tokens for c in chunks if c.usage)

    def photos():
        text_only = ask_vision([question])
        seen = []
        for megabytes, stream, messages_first, image_tokens in (
                (0.1, False, False, 36), (0.1, True, False, 36), (2, False, False, 196),
                (0.1, False, True, 36), (2, False, True, 196), (2, True, True, 196)):
            url = photo_url(megabytes)
            content = [{"type": "image_url", "image_url": {"url": url}}, question]
            tokens = (ask_vision_messages_first(content, stream) if messages_first
                      else ask_vision(content, stream))
            assert tokens == text_only + image_tokens + 2, (megabytes, stream, messages_first, tokens, text_only)
            seen.append(f"{len(url)}-byte image_url{' streamed' if stream else ''}"
                        f"{' messages first' if messages_first else ''}: {tokens - text_only} tokens")
        # An 8 MB photo is 10.7 MB of body: over the example client's max_body_bytes (8 MiB), refused by the gateway
        # before anything reads it, in either key order.
        url = photo_url(8)
        for messages_first in (False, True):
            try:
                content = [{"type": "image_url", "image_url": {"url": url}}, question]
                if messages_first:
                    ask_vision_messages_first(content)
                else:
                    ask_vision(content)
            except openai.APIStatusError as exc:
                assert exc.status_code == 413 and "larger than this API key may send" in str(exc), exc
                seen.append(f"{len(url)}-byte image_url{' messages first' if messages_first else ''}: 413")
                continue
            raise AssertionError("a body over the client's max_body_bytes was answered")
        return "; ".join(seen)

    def unknown_model():
        try:
            client.chat.completions.create(model="no-such-model", max_tokens=1,
                                           messages=[{"role": "user", "content": "hi"}])
        except openai.NotFoundError as exc:
            return str(exc)[:200]
        raise AssertionError("an unknown model was answered")

    def models():
        names = sorted(model.id for model in client.models.list())
        assert chat_model in names and embed_model in names and vision_model in names, names
        return names

    for name, func in [("chat", chat), ("chat_stream", chat_stream), ("embeddings", embeddings),
                       ("embeddings_over_64_kb", embeddings_over_64_kb), ("chat_over_64_kb", chat_over_64_kb),
                       ("photos", photos), ("unknown_model", unknown_model), ("models", models)]:
        check(name, func)
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
