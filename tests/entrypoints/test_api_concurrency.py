"""The server under concurrent load: many streams at once, hang-ups mid-stream, floods past
the admission bounds (429 before any chunk), against the shared SmolLM2 server."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
from server_helper import API_KEY, metric

# ---- concurrency, hang-ups, admission -------------------------------------------------------------


def _stream_one(url: str, model: str, i: int) -> tuple[int, int]:
    body = {
        "model": model,
        "prompt": f"Story number {i}:",
        "max_tokens": 20,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    n_text_chunks, usage = 0, None
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    n_text_chunks += 1
                if chunk.get("usage"):
                    usage = chunk["usage"]
    return n_text_chunks, usage["completion_tokens"]


def test_16_concurrent_streams_complete_with_correct_usage(server, model_name):
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: _stream_one(server.url, model_name, i), range(16)))
    assert all(tokens == 20 for _, tokens in results)
    assert all(chunks >= 1 for chunks, _ in results)


def test_disconnect_mid_stream_frees_blocks(server, http, model_name):
    body = {
        "model": model_name,
        "prompt": "Write an endless essay.",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    ) as r:
        # Hold the iterator: a generator dropped after `break` is collected, and httpx then
        # closes the connection, which the server (rightly) takes for a hang-up.
        lines = r.iter_lines()
        for _ in range(11):
            next(lines)
        # The gauges follow the engine's messages: give them a moment to agree.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            busy = metric(http, "cadence:num_requests_running") == 1
            if busy and metric(http, "cadence:kv_cache_usage_perc") > 0:
                break
            time.sleep(0.05)
        assert metric(http, "cadence:num_requests_running") == 1
        assert metric(http, "cadence:kv_cache_usage_perc") > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (
            metric(http, "cadence:num_requests_running") == 0
            and metric(http, "cadence:kv_cache_usage_perc") == 0
        ):
            break
        time.sleep(0.05)
    assert metric(http, "cadence:num_requests_running") == 0
    assert metric(http, "cadence:kv_cache_usage_perc") == 0


def test_flood_beyond_the_queue_gets_429_and_admitted_requests_finish(server, http, model_name):
    rejected_before = metric(http, "cadence:requests_rejected_total")

    def one(i):
        r = httpx.post(
            server.url + "/v1/completions",
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=120,
            json={"model": model_name, "prompt": f"Item {i}", "max_tokens": 16, "ignore_eos": True},
        )
        return r

    with cf.ThreadPoolExecutor(40) as pool:
        responses = list(pool.map(one, range(40)))
    codes = [r.status_code for r in responses]
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    for r in responses:
        if r.status_code == 429:
            assert "Retry-After" in r.headers and r.json()["error"]["type"] == "rate_limit_exceeded"
        else:
            assert r.json()["usage"]["completion_tokens"] == 16
    assert metric(http, "cadence:requests_rejected_total") - rejected_before == codes.count(429)


def test_flood_of_streamed_chats_gets_429_before_any_chunk(server, model_name):
    """Admission happens before the first SSE chunk: a full server answers 429, never a
    200 stream that then breaks off."""

    def one(i):
        return httpx.post(
            server.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=120,
            json={
                "model": model_name,
                "messages": [{"role": "user", "content": f"Item {i}"}],
                "max_tokens": 8,
                "stream": True,
            },
        )

    with cf.ThreadPoolExecutor(40) as pool:
        responses = list(pool.map(one, range(40)))
    codes = [r.status_code for r in responses]
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    for r in responses:
        if r.status_code == 200:
            assert r.text.rstrip().endswith("data: [DONE]")
            assert '"error"' not in r.text
