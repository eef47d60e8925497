# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_known_answers module over real HTTP against a TEST DOUBLE of vLLM's chat and embeddings endpoints
(answers in vLLM's response format, scripted per test), with its answers file on disk: record, pass, a changed
answer rolled into a failure, NaN, accept and record_missing, check mode, a pooling server."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_known_answers

KEY = "test-key-123456789"


def chat_body(tokens, logprob=-0.25):
    content = [{"token": tok, "logprob": logprob, "top_logprobs": [{"token": tok, "logprob": logprob},
                                                                   {"token": "~", "logprob": -5.0}]} for tok in tokens]
    return json.dumps({"choices": [{"index": 0, "logprobs": {"content": content}}]}, allow_nan=True)


class AnswersDouble:
    """TEST DOUBLE of a vLLM server's answers: .tokens per prompt (the prompt's first word), .logprob, .status."""

    def __init__(self):
        self.tokens, self.logprob, self.status, self.embedding, self.requests = {}, -0.25, 200, [1.0, 0.0], []
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append((self.path, body, self.headers.get("Authorization")))
                if self.path == "/v1/embeddings":
                    text = json.dumps({"data": [{"embedding": double.embedding}]})
                else:
                    prompt = body["messages"][0]["content"]
                    text = chat_body(double.tokens.get(prompt.split()[0], ["A", "B", "C"]), double.logprob)
                data = text.encode()
                self.send_response(double.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def double():
    srv = AnswersDouble()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def gate(call_module, double, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"torch_dtype": "bfloat16"}))

    def run(**args):
        base = dict(url=double.url, api_key=KEY, served_model_name="q", config_dir=str(tmp_path), name="vllm",
                    model="onprem-lab/tiny-qwen3", revision="d" * 40, model_config=str(config),
                    prompts=["Paris is", "Count to three"], positions=3)
        base.update(args)
        return call_module(vllm_known_answers, **base)
    return run


def test_record_then_pass_then_a_changed_token_fails(gate, double, tmp_path):
    rc, result = gate()
    assert rc == 0 and result["changed"] and result["outcome"] == "recorded"
    stored = json.loads((tmp_path / "vllm.answers.json").read_text())
    assert stored["identity"]["dtype"] == "bfloat16" and stored["identity"]["revision"] == "d" * 40
    assert [a["tokens"] for a in stored["answers"]] == [["A", "B", "C"], ["A", "B", "C"]]
    assert all(r[2] == "Bearer " + KEY and r[1]["temperature"] == 0 for r in double.requests)

    rc, result = gate(image="vllm/vllm-openai:v0.32.0-lab2")
    assert rc == 0 and not result["changed"] and result["outcome"] == "passed" and result["failures"] == []

    double.tokens["Count"] = ["A", "X", "C"]
    rc, result = gate()
    assert rc == 1 and "known-answer gate failed on 1 of 2 prompts" in result["msg"]
    assert "prompt 'Count to three': first diverging token at position 1: 'X'" in result["msg"]
    assert json.loads((tmp_path / "vllm.answers.json").read_text()) == stored  # a failure records nothing

    # An unchanged server never fails on it; accept records the new answers.
    rc, result = gate(mode="record_missing")
    assert rc == 0 and result["outcome"] == "kept" and not result["changed"]
    rc, result = gate(mode="accept")
    assert rc == 0 and result["outcome"] == "recorded" and result["changed"]
    assert gate()[1]["outcome"] == "passed"


def test_a_new_revision_records_fresh_answers_and_says_it_was_not_gated(gate, double):
    assert gate()[1]["outcome"] == "recorded"
    assert gate()[1]["note"] == ""
    double.tokens["Count"] = ["A", "X", "C"]  # another revision answers otherwise: it is not compared
    rc, result = gate(revision="e" * 40)
    assert rc == 0 and result["outcome"] == "recorded" and result["failures"] == []
    assert result["note"] == ("no recorded answers for revision %s (this host's were for revision %s): recorded now, "
                              "not gated" % ("e" * 40, "d" * 40))


def test_nan_fails_even_without_recorded_answers(gate, double, tmp_path):
    double.logprob = float("nan")
    rc, result = gate()
    assert rc == 1 and "non-finite value (nan)" in result["msg"]
    assert not (tmp_path / "vllm.answers.json").exists()


def test_a_server_error_fails_with_its_answer(gate, double):
    double.status = 500
    rc, result = gate()
    assert rc == 1 and "did not answer the prompt set" in result["msg"] and "HTTP 500" in result["msg"]


def test_check_mode_asks_nothing(gate, double):
    rc, result = gate(_ansible_check_mode=True)
    assert rc == 0 and result["outcome"] == "skipped" and double.requests == []


def test_a_pooling_server_compares_embeddings(gate, double):
    assert gate(runner="pooling")[1]["outcome"] == "recorded"
    double.embedding = [0.6, 0.8]
    rc, result = gate(runner="pooling")
    assert rc == 1 and "cosine similarity 0.600000 < 0.995" in result["msg"]
