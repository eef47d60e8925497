#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_known_answers
short_description: Gate a vLLM server on known answers - a fixed prompt set answered as it was before
version_added: 0.2.0
author: onprem.vllm developers (@onprem)
description:
  - Runs on the vLLM host after the health gate. Asks the server each of O(prompts), one at a time, greedily with the
    logprobs of the top tokens (a pooling server - one embedding each), and compares the answers with those recorded
    the first time the same model, revision, checkpoint dtype, runner and prompt set passed here (C(NAME.answers.json) beside the
    deployment record in O(config_dir)).
  - A generated answer matches when its first O(positions) tokens are the recorded ones, each logprob within
    O(max_logprob_delta) of the recorded one. A position where the recording was a near tie (top two logprobs closer
    than O(tie_margin)) may flip, since vLLM is not batch invariant; the rest of that answer is then not compared. A
    non-finite logprob always fails. Embeddings match when their cosine similarity is at least O(min_cosine).
  - Without recorded answers for this identity (a new model, revision, dtype or prompt set) the answers are recorded
    in place of any others, and the server is not gated; RV(note) says so and what the replaced answers were for (a
    changed revision is never compared with another revision's answers). O(mode=accept) records the server's answers
    in any case (an upgrade whose different answers an operator has checked); O(mode=record_missing) only records
    where none are (a server that is not being replaced) and never fails on a difference.
  - A failure's message names the first failing prompt and its first diverging token.
extends_documentation_fragment:
  - onprem.vllm.vllm_server
options:
  served_model_name:
    description: The model name the server answers to.
    type: str
    required: true
  runner:
    description: C(generate) (chat completions with logprobs) or C(pooling) (embeddings).
    type: str
    default: generate
    choices: [generate, pooling]
  config_dir:
    description: The server's config directory, where the answers are kept.
    type: path
    required: true
  name:
    description: The server's container name.
    type: str
    required: true
  model:
    description: The model (repository id or path) the answers are valid for.
    type: str
    required: true
  revision:
    description: The model's commit the answers are valid for.
    type: str
    default: ""
  model_config:
    description: >-
      The model's C(config.json) on the host (the pinned revision's snapshot); its C(torch_dtype) (or C(dtype)) is
      the checkpoint's dtype the answers are valid for. Empty - C(unknown). A serving-side change (C(--dtype),
      C(--kv-cache-dtype), C(--quantization), the image) keeps the identity: it is what the gate is there to catch.
    type: path
    default: ""
  prompts:
    description: The prompt set; empty means the collection's default set of five short prompts.
    type: list
    elements: str
    default: []
  image_prompt:
    description: >-
      Whether a vision-language model (its O(model_config) has a C(vision_config)) also answers the collection's
      fixed image prompt (a 128x128 PNG of four coloured squares, sent as a base64 C(image_url)). False where the
      server takes no images (C(--limit-mm-per-prompt) with C(image) at 0).
    type: bool
    default: true
  positions:
    description: How many generated tokens of each answer are compared.
    type: int
    default: 16
  top_logprobs:
    description: How many top logprobs each position returns (at least 2, for the near-tie margin).
    type: int
    default: 5
  max_logprob_delta:
    description: Largest difference (nats) between a token's logprob and the recorded one.
    type: float
    default: 0.5
  tie_margin:
    description: A recorded position whose top two logprobs are closer than this (nats) may flip.
    type: float
    default: 0.5
  min_cosine:
    description: Smallest cosine similarity between an embedding and the recorded one.
    type: float
    default: 0.995
  mode:
    description: C(gate), C(record_missing) or C(accept) (see the description).
    type: str
    default: gate
    choices: [gate, record_missing, accept]
  image:
    description: The image the server runs, kept with recorded answers.
    type: str
    default: ""
  request_timeout:
    description: Seconds one request may take.
    type: int
    default: 120
notes:
  - Check mode is supported - nothing is asked or written.
attributes:
  check_mode:
    description: Asks nothing and writes nothing.
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
"""

EXAMPLES = r"""
- name: Compare the new server's answers with the recorded ones
  onprem.vllm.vllm_known_answers:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_api_key }}"
    served_model_name: qwen3-30b-a3b
    config_dir: /etc/onprem-vllm
    name: vllm
    model: Qwen/Qwen3-30B-A3B-FP8
    revision: 0123456789abcdef0123456789abcdef01234567
    image: vllm/vllm-openai:v0.32.0
"""

RETURN = r"""
outcome:
  description: C(passed), C(recorded) (no answers for this identity yet, or O(mode=accept)), C(kept)
    (O(mode=record_missing) with answers already recorded), C(differs) (O(mode=record_missing) and the answers differ)
    or C(skipped) (check mode).
  returned: always
  type: str
failures:
  description: One line per failing prompt (empty when the answers match).
  returned: always
  type: list
  elements: str
seconds:
  description: Seconds the prompts took.
  returned: always
  type: float
answers_file:
  description: Where the answers are kept.
  returned: always
  type: str
note:
  description: >-
    Why the answers were recorded instead of compared (the server was not gated), for example "no recorded answers
    for revision X (this host's were for revision Y): recorded now, not gated"; empty otherwise.
  returned: always
  type: str
recorded_with:
  description: The image and time the compared answers were recorded with.
  returned: when answers were compared
  type: dict
"""

from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.onprem.vllm.plugins.module_utils import deployment_record, known_answers, vllm_http


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vllm_http.SERVER_ARGUMENT_SPEC,
            served_model_name=dict(type="str", required=True),
            runner=dict(type="str", default="generate", choices=["generate", "pooling"]),
            config_dir=dict(type="path", required=True),
            name=dict(type="str", required=True),
            model=dict(type="str", required=True),
            revision=dict(type="str", default=""),
            model_config=dict(type="path", default=""),
            prompts=dict(type="list", elements="str", default=[]),
            image_prompt=dict(type="bool", default=True),
            positions=dict(type="int", default=16),
            top_logprobs=dict(type="int", default=5),
            max_logprob_delta=dict(type="float", default=0.5),
            tie_margin=dict(type="float", default=0.5),
            min_cosine=dict(type="float", default=0.995),
            mode=dict(type="str", default="gate", choices=["gate", "record_missing", "accept"]),
            image=dict(type="str", default=""),
            request_timeout=dict(type="int", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        path = deployment_record.answers_path(p["config_dir"], p["name"])
    except deployment_record.RecordError as exc:
        module.fail_json(msg=str(exc))
    result = dict(changed=False, failures=[], seconds=0.0, answers_file=path, note="")
    if module.check_mode:
        module.exit_json(outcome="skipped", **result)

    problem = vllm_http.tls_problem(p) or vllm_http.tls_files_problem(p)
    if problem:
        module.fail_json(msg=problem, **result)
    http = vllm_http.Server(p, timeout=p["request_timeout"]).request

    try:
        result = known_answers.run(
            http, answers_file=path, model=p["model"], revision=p["revision"], model_config=p["model_config"],
            runner=p["runner"], served_model_name=p["served_model_name"], prompts=p["prompts"],
            image_prompt=p["image_prompt"], positions=p["positions"], top_logprobs=p["top_logprobs"],
            max_logprob_delta=p["max_logprob_delta"], tie_margin=p["tie_margin"], min_cosine=p["min_cosine"],
            mode=p["mode"], image=p["image"],
            read_json=deployment_record.read,
            write_json=lambda target, content: deployment_record.write(target, deployment_record.dumps(content)),
            now=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    except deployment_record.RecordError as exc:
        module.fail_json(msg=str(exc), **result)
    except OSError as exc:
        module.fail_json(msg="cannot write %s: %s" % (path, exc), **result)
    error = result.pop("error")
    if error:
        module.fail_json(msg=error, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
