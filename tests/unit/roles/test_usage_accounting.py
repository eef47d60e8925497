# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Token accounting: the usage middleware vllm_server mounts into the container (driven as ASGI, no server needed) and
the gateway's usage service (budgets, metrics, the report, HAProxy's ACL over a fake admin socket)."""
from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import os
import socket
import threading

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


usage = _load("onprem_vllm_usage", "roles", "vllm_server", "files", "onprem_vllm_usage.py")
service = _load("onprem_gateway_usage", "roles", "gateway", "files", "onprem_gateway_usage.py")

CHAT = {"id": "x", "object": "chat.completion", "model": "qwen3", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": 'he wrote "usage": {"prompt_tokens": 999}'}}],
    "usage": {"prompt_tokens": 12, "total_tokens": 19, "completion_tokens": 7, "prompt_tokens_details": None},
    "prompt_logprobs": 'a decoy after it: "usage": {"prompt_tokens": 999}'}


def _sse(events):
    return b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"


def _stream_events(tokens, prompt=5):
    """vLLM's chunks with --enable-force-include-usage: the usage so far in every chunk, a last one without choices."""
    events = [{"choices": [{"delta": {"content": "t"}}], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                                                   "total_tokens": prompt + n}}
              for n in range(1, tokens + 1)]
    events.append({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": tokens,
                                            "total_tokens": prompt + tokens}})
    return events


def _scan(body, piece):
    scanner = usage.UsageScanner()
    for start in range(0, len(body), piece):
        scanner.feed(body[start:start + piece])
    return scanner.usage


@pytest.mark.parametrize("piece", [1, 3, 7, 64, 100000])
def test_the_last_usage_is_found_in_any_cut_of_the_body_and_never_inside_a_string(piece):
    assert usage.tokens_of(_scan(json.dumps(CHAT).encode(), piece)) == (12, 7)
    assert usage.tokens_of(_scan(_sse(_stream_events(9)), piece)) == (5, 9)


def test_usage_of_every_api_shape():
    embeddings = {"data": [{"embedding": [0.1] * 50}], "usage": {"prompt_tokens": 4, "total_tokens": 4}}
    responses = [{"type": "response.created", "response": {"usage": None}},
                 {"type": "response.completed", "response": {"usage": {"input_tokens": 8, "output_tokens": 3,
                                                                       "input_tokens_details": {"cached_tokens": 0}}}}]
    error = {"error": {"message": "too long", "code": 400}}
    assert usage.tokens_of(_scan(json.dumps(embeddings).encode(), 5)) == (4, 0)
    assert usage.tokens_of(_scan(_sse(responses), 5)) == (8, 3)
    assert _scan(json.dumps(error).encode(), 5) is None
    assert usage.tokens_of(None) == (0, 0)
    assert usage.tokens_of({"prompt_tokens": True, "completion_tokens": -3}) == (0, 0)


def test_a_stream_cut_midway_counts_what_it_used():
    body = _sse(_stream_events(20))
    cut = body[:len(body) // 2]
    found = _scan(cut, 17)
    assert found is not None and 0 < usage.tokens_of(found)[1] < 20


def _app(body_pieces, status=200, fail_after=None):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        for number, piece in enumerate(body_pieces):
            if fail_after is not None and number == fail_after:
                raise asyncio.CancelledError()  # the client went away: uvicorn cancels the request
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return app


def _call(middleware, path="/v1/chat/completions", method="POST", headers=()):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
    try:
        asyncio.run(middleware(scope, receive, send))
    except asyncio.CancelledError:
        pass
    return sent


def _middleware(tmp_path, app, name="ledger"):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return usage.UsageMiddleware(app, directory=str(folder), model="qwen3")


def test_each_answer_counts_under_the_gateway_named_client_and_survives_a_restart(tmp_path):
    body = json.dumps(CHAT).encode()
    app = _app([body[:40], body[40:]])
    middleware = _middleware(tmp_path, app)
    _call(middleware, headers=[(b"x-onprem-client", b"ide-assistants")])
    _call(middleware, headers=[(b"x-onprem-client", b"ide-assistants")])
    _call(middleware)  # a gate on the host: no gateway, no client
    _call(middleware, headers=[(b"x-onprem-client", b"bad name\n")])
    _call(middleware, path="/health", method="GET")  # not counted
    _call(_middleware(tmp_path, _app([_sse(_stream_events(4))])), headers=[(b"x-onprem-client", b"batch-jobs")])
    _call(_middleware(tmp_path, _app([_sse(_stream_events(30))], fail_after=0)),
          headers=[(b"x-onprem-client", b"batch-jobs")])  # cancelled before any chunk: a request, no tokens
    # A new server process on the same folder (a restart or a replacement) sees every count, folded.
    restarted = _middleware(tmp_path, app)
    day = usage.utc_day()
    assert usage.as_days(restarted.ledger.totals()) == {day: {
        "ide-assistants": {"qwen3": [2, 24, 14]}, "direct": {"qwen3": [2, 24, 14]}, "batch-jobs": {"qwen3": [2, 5, 4]}}}
    lines = (tmp_path / "ledger" / "usage.jsonl").read_bytes().splitlines()
    assert len(lines) == 3  # folded at start-up: one line per day, client and model
    answer = _call(restarted, path="/onprem/usage", method="GET")
    data = json.loads(answer[1]["body"])
    assert data["model"] == "qwen3" and data["ledger"] == restarted.ledger.ledger_id
    assert data["days"][day]["batch-jobs"] == {"qwen3": [2, 5, 4]}


def test_a_torn_line_is_skipped_and_two_processes_share_one_ledger(tmp_path):
    first = _middleware(tmp_path, _app([json.dumps(CHAT).encode()]))
    second = _middleware(tmp_path, _app([json.dumps(CHAT).encode()]))
    assert first.ledger.ledger_id == second.ledger.ledger_id
    _call(first)
    second.ledger.compact()  # the other process replaced the file: the first appends to the new one
    _call(first)
    _call(second)
    with open(tmp_path / "ledger" / "usage.jsonl", "ab") as handle:
        handle.write(b'{"day": "2026-01-01", "client": "x", "mod')  # a power cut mid-line
    totals = first.ledger.totals()
    assert totals == {(usage.utc_day(), "direct", "qwen3"): [3, 36, 21]}


def test_a_folder_that_cannot_be_used_stops_the_server_at_startup(tmp_path, monkeypatch):
    monkeypatch.delenv(usage.USAGE_DIR_ENV, raising=False)
    with pytest.raises(RuntimeError, match="ONPREM_VLLM_USAGE_DIR"):
        usage.UsageMiddleware(_app([]))
    with pytest.raises(OSError):
        usage.UsageMiddleware(_app([]), directory=str(tmp_path / "missing"))


# ---- the gateway's usage service ------------------------------------------------------------------------------------

BACKENDS = [{"name": "chat", "served_names": ["qwen3", "assistant"]}, {"name": "embed", "served_names": ["embed"]}]


def _answer(ledger, days):
    return {"ledger": ledger, "model": "m", "days": days}


def test_periods_roll_over_on_utc_days():
    sunday = datetime.date(2026, 12, 6)
    assert service.period_bounds("day", sunday) == (sunday, datetime.date(2026, 12, 7))
    assert service.period_bounds("week", sunday) == (datetime.date(2026, 11, 30), datetime.date(2026, 12, 7))
    assert service.period_bounds("month", sunday) == (datetime.date(2026, 12, 1), datetime.date(2027, 1, 1))
    assert service.period_bounds("30d", sunday) == (datetime.date(2026, 11, 7), datetime.date(2026, 12, 7))


def test_budgets_count_their_period_and_models_and_refuse_only_that_client():
    answers = [
        _answer("a" * 32, {"2026-12-06": {"batch": {"qwen3": [3, 600, 400]}, "ide": {"qwen3": [1, 10, 10]}},
                           "2026-12-05": {"batch": {"qwen3": [9, 5000, 5000]}}}),
        _answer("b" * 32, {"2026-12-06": {"batch": {"embed": [2, 100, 0]}}}),
    ]
    totals = service.merge(answers)
    clients = [{"name": "batch", "token_budgets": [{"tokens": 1000, "period": "day", "models": ["assistant"]},
                                                   {"tokens": 20000, "period": "month"}]},
               {"name": "ide", "token_budgets": []}]
    states = service.budget_states(totals, clients, BACKENDS, datetime.date(2026, 12, 6))
    assert [(s["used"], s["over"], s["models"]) for s in states] == [(1000, True, ["qwen3"]), (11100, False, [])]
    assert service.refused_grants(states) == ["batch/assistant", "batch/qwen3"]
    text = service.render_metrics(totals, states, 2, 1, 0.0)
    assert 'onprem_vllm_usage_tokens_total{client="batch",model="qwen3",kind="prompt"} 5600' in text
    assert 'onprem_vllm_usage_requests_total{client="ide",model="qwen3"} 1' in text
    assert 'onprem_vllm_usage_budget_used_tokens{client="batch",period="day",models="qwen3"} 1000' in text
    assert 'onprem_vllm_usage_budget_tokens{client="batch",period="month",models="all"} 20000' in text
    assert 'onprem_vllm_usage_servers{result="unanswered"} 1' in text
    rows = service.report_rows(totals, "2026-12-06", "2026-12-06")
    assert rows[0] == {"client": "batch", "model": "embed", "requests": 2, "prompt_tokens": 100,
                       "completion_tokens": 0, "total_tokens": 100}
    table = service.report_table(rows, "2026-12-06", "2026-12-06")
    assert "total" in table and "1120" in table  # 100 + 1000 + 20


class _FakeAdmin:
    """HAProxy's admin socket for `show acl`, `add acl`, `del acl` of one ACL."""

    def __init__(self, path):
        self.entries, self.commands = [], []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            conn, _address = self.server.accept()
            with conn:
                command = conn.recv(4096).decode().strip()
                self.commands.append(command)
                verb, _acl, name, *rest = command.split(" ")
                if verb == "show":
                    conn.sendall("".join("0x%x %s\n" % (i, e) for i, e in enumerate(self.entries)).encode() + b"\n")
                elif verb == "add":
                    self.entries.append(rest[0])
                elif verb == "del":
                    self.entries.remove(rest[0])


def test_the_service_keeps_each_ledger_once_and_applies_refusals_to_file_and_haproxy(tmp_path, monkeypatch, capsys):
    admin = _FakeAdmin(str(tmp_path / "admin.sock"))
    admin.entries = ["batch/stale"]
    answers = {"http://ws1:8000": _answer("a" * 32, {"2026-12-06": {"batch": {"qwen3": [1, 900, 200]}}}),
               "http://ws1-again:8000": _answer("a" * 32, {"2026-12-06": {"batch": {"qwen3": [1, 900, 200]}}}),
               "http://ws2:8000": None}
    monkeypatch.setattr(service, "poll", lambda url, key, timeout, context=None: answers[url])
    config = {"key": "k", "state_dir": str(tmp_path / "state"), "acl_file": str(tmp_path / "over-budget.lst"),
              "acl_name": "/var/lib/haproxy-state/over-budget.lst", "admin_socket": str(tmp_path / "admin.sock"),
              "servers": [{"name": name, "url": url}
                          for name, url in (("a", "http://ws1:8000"), ("b", "http://ws1-again:8000"), ("c", "http://ws2:8000"))],
              "backends": BACKENDS, "clients": [{"name": "batch", "token_budgets": [{"tokens": 1000, "period": "day"}]}]}
    states = service.Service(config).poll_once(datetime.date(2026, 12, 6))
    assert states[0]["used"] == 1100 and states[0]["over"]
    refused = ["batch/assistant", "batch/embed", "batch/qwen3"]
    assert (tmp_path / "over-budget.lst").read_text().split() == refused
    assert sorted(admin.entries) == refused
    # ws1 is down at the next poll: its kept answer still counts, so the refusal stays; a raised budget lifts it.
    answers["http://ws1:8000"] = answers["http://ws1-again:8000"] = None
    config["clients"][0]["token_budgets"][0]["tokens"] = 5000
    states = service.Service(config).poll_once(datetime.date(2026, 12, 6))
    assert states[0]["used"] == 1100 and not states[0]["over"]
    assert admin.entries == [] and (tmp_path / "over-budget.lst").read_text() == ""
    # The report reads the kept answers.
    assert service.main(["report", "--state-dir", config["state_dir"], "--since", "2026-12-01", "--until",
                         "2026-12-31", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == [",".join(service.REPORT_FIELDS), "batch,qwen3,1,900,200,1100"]
    # Per server: the ledger reached at two addresses is one row, under the name it was last reached by.
    assert service.main(["report", "--state-dir", config["state_dir"], "--since", "2026-12-01", "--until",
                         "2026-12-31", "--by-server"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["server"] + service.REPORT_FIELDS
    assert table[3].split() == ["b", "batch", "qwen3", "1", "900", "200", "1100"]
    assert table[5].split() == ["total", "1", "900", "200", "1100"] and len(table) == 6


def test_the_reports_csv_is_drawn_as_a_chart(tmp_path):
    chart = _load("usage_chart", "tools", "usage_chart.py")
    (tmp_path / "usage.csv").write_text(",".join(service.REPORT_FIELDS) + "\nbatch,qwen3,2,90,10,100\n"
                                        "ide,embed,1,5,0,5\n")
    assert chart.main([str(tmp_path / "usage.csv"), str(tmp_path / "usage.png")]) == 0
    assert (tmp_path / "usage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty.csv").write_text(",".join(service.REPORT_FIELDS) + "\n")
    with pytest.raises(SystemExit, match="no rows"):
        chart.main([str(tmp_path / "empty.csv"), str(tmp_path / "empty.png")])


def test_the_service_and_a_poll_by_hand_writing_the_same_copy_at_once_both_land_whole(tmp_path):
    """The usage service polls every few seconds while a poll or report run by hand (playbooks/usage.yml, the fleet's
    check) writes the same server's copy: each write has a temporary file of its own, so neither fails and the copy
    is always one whole answer."""
    path = str(tmp_path / "ledger.json")
    answers = [json.dumps({"ledger": "a" * 32, "writer": n, "pad": "x" * 20000}).encode() for n in range(2)]
    errors = []

    def write(content):
        try:
            for _round in range(300):
                service.write_atomically(path, content)
        except OSError as exc:  # the fixed temporary name of before: FileNotFoundError on the other's rename
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(content,)) for content in answers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with open(path, "rb") as handle:
        assert handle.read() in answers
    assert os.listdir(tmp_path) == ["ledger.json"] and oct(os.stat(path).st_mode & 0o777) == "0o600"
