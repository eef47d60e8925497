# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The load generator against a real local asyncio HTTP server streaming SSE (chunked), and its statistics."""
from __future__ import annotations

import asyncio

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import vllm_loadgen as lg


@pytest.fixture
def server(fake_vllm):
    return fake_vllm()


def body(**kw):
    return lg.build_body("m", "hello", max_tokens=5, **kw)


def test_sse_parser_across_arbitrary_splits():
    stream = b'data: {"a": 1}\n\n: ping\n\ndata: {"b": 2}\r\n\r\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        parser = lg.SSEParser()
        events = parser.feed(stream[:cut]) + parser.feed(stream[cut:]) + parser.flush()
        assert events == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_chunked_decoder_byte_by_byte():
    raw = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    decoder = lg.ChunkedDecoder()
    out = b"".join(decoder.feed(raw[i:i + 1]) for i in range(len(raw)))
    assert out == b"hello world" and decoder.done


def test_chunked_decoder_reads_the_trailer_section_to_its_end():
    decoder = lg.ChunkedDecoder()
    assert decoder.feed(b"2\r\nhi\r\n0\r\nX-Trailer: 1\r\n") == b"hi" and not decoder.done
    decoder.feed(b"\r\n")
    assert decoder.done


def test_percentile_matches_numpy_linear():
    data = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert lg.percentile(data, 50) == 5.5
    assert lg.percentile(data, 99) == pytest.approx(9.91)
    assert lg.percentile([], 50) is None and lg.percentile([3], 99) == 3


def test_build_body_streams_with_usage_and_ignore_eos():
    b = lg.build_body("qwen", "hi", system_prompt="be brief", max_tokens=64, ignore_eos=True)
    assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
    assert b["messages"][0] == {"role": "system", "content": "be brief"}
    # What `vllm bench serve --ignore-eos` sends, nothing more: the two clients must put the same load on the server.
    assert b["ignore_eos"] is True and "min_tokens" not in b
    assert "ignore_eos" not in lg.build_body("qwen", "hi", max_tokens=64)


@pytest.mark.parametrize("levels", [[1, 0, 4], [0], [], "1,0", [-2], ["x"]])
def test_concurrency_with_zero_or_garbage_is_refused(levels):
    with pytest.raises(lg.LoadgenError) as err:
        lg.check_concurrency(levels)
    assert "concurrency" in str(err.value)


def test_chat_url_forms():
    assert lg.chat_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert lg.chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    with pytest.raises(lg.LoadgenError):
        lg.chat_url("h:8000")


def test_one_streaming_request(server):
    res = asyncio.run(lg.stream_chat(lg.chat_url(server.url), server.key, body()))
    assert res["ok"], res
    assert res["output_tokens"] == 5 and res["prompt_tokens"] == 7
    assert 0 < res["ttft"] < res["latency"]
    assert res["decode_tps"] > 0 and len(res["itl"]) == 5  # role chunk + 5 tokens: 5 gaps
    assert server.bodies[0]["stream_options"] == {"include_usage": True}


def test_sweep_aggregates(server):
    out = lg.run_sweep(lg.chat_url(server.url), server.key, body(), [1, 3], {1: 4, 3: 6}, warmup=1)
    assert not out["partial"] and [lv["concurrency"] for lv in out["levels"]] == [1, 3]
    level = out["levels"][1]
    assert level["requests"] == 6 and level["successful"] == 6 and level["output_tokens"] == 30
    assert level["ttft_p50_ms"] <= level["ttft_p99_ms"]
    assert level["output_throughput"] == pytest.approx(30 / level["duration_s"], rel=0.02)
    assert len(server.bodies) == 1 + 4 + 6
    # This server closes every connection after its answer: each pooled connection went stale and was replaced.
    assert server.connections == 1 + 4 + 6


def test_sweep_sends_a_list_of_bodies_in_request_order(server):
    bodies = [lg.build_body("m", "hello", max_tokens=n) for n in (7, 9, 11)]
    out = lg.run_sweep(lg.chat_url(server.url), server.key, bodies, [1, 2], {1: 5, 2: 4}, warmup=1)
    assert not out["partial"] and [lv["successful"] for lv in out["levels"]] == [5, 4]
    sent = [b["max_tokens"] for b in server.bodies]
    # Warm-up (the first body), then concurrency 1 in index order, cycling; at 2 the same four, in either order.
    assert sent[:6] == [7, 7, 9, 11, 7, 9]
    assert sorted(sent[6:]) == [7, 7, 9, 11]


def test_sweep_keeps_connections_alive(fake_vllm):
    srv = fake_vllm(keep_alive=True)
    out = lg.run_sweep(lg.chat_url(srv.url), srv.key, body(), [1, 3], {1: 4, 3: 6}, warmup=1)
    assert not out["partial"] and sum(lv["successful"] for lv in out["levels"]) == 10
    assert len(srv.bodies) == 11 and srv.connections <= 3


def test_wrong_key_is_a_clear_partial_result(server):
    out = lg.run_sweep(lg.chat_url(server.url), "wrong", body(), [1, 2], 2, warmup=1)
    assert out["partial"] and out["levels"] == []
    assert "HTTP 401" in out["notes"][0] and "API key" in out["notes"][0]


def test_unreachable_host_is_a_clear_partial_result():
    out = lg.run_sweep("http://127.0.0.1:9/v1/chat/completions", "any-key", body(), [1], 2, warmup=0, timeout=5)
    assert out["partial"] and out["levels"][0]["successful"] == 0
    assert "cannot reach" in out["notes"][0] or "timed out" in out["notes"][0]


def test_baseline_gate():
    base = [{"concurrency": 4, "output_throughput": 100.0, "ttft_p99_ms": 50.0}]
    ok, rows = lg.compare_to_baseline([{"concurrency": 4, "output_throughput": 95.0, "ttft_p99_ms": 55.0}], base, 10, 25)
    assert ok == [] and rows[0]["output_throughput"]["change_pct"] == -5.0
    bad, rows = lg.compare_to_baseline([{"concurrency": 4, "output_throughput": 80.0, "ttft_p99_ms": 70.0}], base, 10, 25)
    assert len(bad) == 2 and "dropped 20.0%" in bad[0] and "rose 40.0%" in bad[1]
