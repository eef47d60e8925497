# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two clients through the gateway with the real OpenAI Python client, for the token accounting checks.

Runs inside a container of the lab's vLLM image (it ships the openai package) on the fleet's network:
  python3 usage_client.py load   BASE_URL CAFILE KEYDIR CHAT_MODEL[,OTHER_GENERATE_MODEL...] EMBED_MODEL CLIENT...
  python3 usage_client.py budget BASE_URL CAFILE KEYDIR CHAT_MODEL REFUSED_CLIENT SERVED_CLIENT
KEYDIR/<client>.key holds each client's key. load: per client, chat answers plain and streamed (the stream asks for
no usage: the server adds it to every chunk) from the first model, one of each from every other generating model, and
an embedding batch; prints {client: {model: [requests, prompt,
completion]}} summed from the usage each answer carried (a stream's last). budget: prints the refused client's error
(status, type, code) and whether the other client was served.
"""
from __future__ import annotations

import json
import sys

import httpx
import openai


def _client(base_url, cafile, keydir, name):
    with open(f"{keydir}/{name}.key", encoding="utf-8") as handle:
        key = handle.read().strip()
    return openai.OpenAI(base_url=base_url, api_key=key, http_client=httpx.Client(verify=cafile, timeout=120),
                         max_retries=0)


def _add(counts, model, prompt, completion):
    entry = counts.setdefault(model, [0, 0, 0])
    entry[0] += 1
    entry[1] += prompt
    entry[2] += completion


def _chat(client, counts, model, max_tokens, content, stream):
    if not stream:
        answer = client.chat.completions.create(model=model, max_tokens=max_tokens,
                                                messages=[{"role": "user", "content": content}])
        _add(counts, model, answer.usage.prompt_tokens, answer.usage.completion_tokens)
        return
    chunks = list(client.chat.completions.create(model=model, max_tokens=max_tokens, stream=True,
                                                 messages=[{"role": "user", "content": content}]))
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    if not usage:
        raise AssertionError("a stream of %s carried no usage: the server does not force it" % model)
    _add(counts, model, usage[-1].prompt_tokens, usage[-1].completion_tokens)


def load(base_url, cafile, keydir, generate_models, embed_model, clients):
    chat_model, *other_models = generate_models.split(",")
    received = {}
    for number, name in enumerate(clients):
        client = _client(base_url, cafile, keydir, name)
        counts = received.setdefault(name, {})
        for turn in range(3):
            _chat(client, counts, chat_model, 4 + turn + number, f"Client {name}, question {turn}: say something.", False)
            _chat(client, counts, chat_model, 6 + turn, f"Client {name}, stream {turn}: count.", True)
        for model in other_models:
            _chat(client, counts, model, 3 + number, f"Client {name}: route this.", False)
            _chat(client, counts, model, 5, f"Client {name}: stream this.", True)
        answer = client.embeddings.create(model=embed_model, input=[f"{name} passage {n}" for n in range(5)])
        _add(counts, embed_model, answer.usage.prompt_tokens, 0)
    return received


def budget(base_url, cafile, keydir, chat_model, refused, served):
    outcome = {}
    try:
        _client(base_url, cafile, keydir, refused).chat.completions.create(
            model=chat_model, max_tokens=2, messages=[{"role": "user", "content": "over budget?"}])
        outcome["refused"] = {"status": 200}
    except openai.APIStatusError as exc:
        error = (exc.body or {}) if isinstance(exc.body, dict) else {}
        outcome["refused"] = {"status": exc.status_code, "type": error.get("type"), "code": error.get("code"),
                              "message": error.get("message")}
    answer = _client(base_url, cafile, keydir, served).chat.completions.create(
        model=chat_model, max_tokens=2, messages=[{"role": "user", "content": "still served?"}])
    outcome["served"] = {"status": 200, "completion_tokens": answer.usage.completion_tokens}
    return outcome


def main(argv):
    mode, base_url, cafile, keydir, chat_model, *rest = argv
    if mode == "load":
        result = load(base_url, cafile, keydir, chat_model, rest[0], rest[1:])
    else:
        result = budget(base_url, cafile, keydir, chat_model, rest[0], rest[1])
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
