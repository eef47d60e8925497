# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's deployments through the gateway with the real OpenAI Python client, in its own key order.

Runs inside a container of the lab's vLLM image (it ships the openai package vLLM itself uses) on the fleet's network:
  python3 openai_client_checks.py BASE_URL CAFILE KEYFILE CHAT_MODEL EMBED_MODEL EMBED_DIMENSIONS
Prints one JSON object with each check's outcome; exits 1 when any check failed. The bodies over 64 KB are sent in the
client's own key order (this release writes "model" first; tests/unit/roles/test_gateway_routing.py also sends them
with "model" last, as other clients do).
"""
from __future__ import annotations

import json
import sys

import httpx
import openai


def main(argv: list[str]) -> int:
    base_url, cafile, keyfile, chat_model, embed_model, dimensions = argv
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

    def unknown_model():
        try:
            client.chat.completions.create(model="no-such-model", max_tokens=1,
                                           messages=[{"role": "user", "content": "hi"}])
        except openai.NotFoundError as exc:
            return str(exc)[:200]
        raise AssertionError("an unknown model was answered")

    def models():
        names = sorted(model.id for model in client.models.list())
        assert chat_model in names and embed_model in names, names
        return names

    for name, func in [("chat", chat), ("chat_stream", chat_stream), ("embeddings", embeddings),
                       ("embeddings_over_64_kb", embeddings_over_64_kb), ("chat_over_64_kb", chat_over_64_kb),
                       ("unknown_model", unknown_model), ("models", models)]:
        check(name, func)
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
