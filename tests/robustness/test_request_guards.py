"""What a client sends cannot stall, crash or walk around the server (issue 14, points 1-3,
7, 8, 10): against the shared SmolLM2 server (API key on, 8 running + 8 queued sequences)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import threading
import time

import httpx
import pytest
from server_helper import API_KEY, metric

TEMPLATE_BOMB = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{{ a * b }}{% endfor %}{% endfor %}"
)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    return err


# ---- 1. templates: client code never runs; rendering is off the event loop --------------


@pytest.mark.parametrize(
    "kwargs", [{"chat_template": TEMPLATE_BOMB}, {"tokenize": False}, {"return_tensors": "pt"}]
)
def test_template_kwargs_that_change_what_runs_are_refused(http, model_name, kwargs):
    messages = [{"role": "user", "content": "hi"}]
    t0 = time.monotonic()
    r = http.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": messages, "chat_template_kwargs": kwargs},
    )
    err = _error(r, 400)
    assert err["param"] == "chat_template_kwargs" and next(iter(kwargs)) in err["message"]
    r = http.post("/tokenize", json={"messages": messages, "chat_template_kwargs": kwargs})
    _error(r, 400)
    assert time.monotonic() - t0 < 5


def test_template_variables_the_template_does_not_read_are_harmless(http, model_name):
    messages = [{"role": "user", "content": "hi"}]
    plain = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    extra = http.post(
        "/tokenize", json={"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert extra.status_code == 200 and extra.json()["tokens"] == plain


def test_health_answers_while_big_prompts_are_tokenized(server, http):
    """Four 4 MB prompts (far over the context: 400s before any tokenizing) and four that
    fit but take the large lane (160,000 characters each); /health stays quick meanwhile."""
    huge = "lorem ipsum dolor sit amet " * 150_000
    long = "lorem ipsum dolor sit amet " * 6_000
    latencies: list[float] = []
    done = threading.Event()

    def probe():
        while not done.is_set():
            t0 = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - t0)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(
                    lambda text: http.post("/tokenize", json={"prompt": text}), [huge, long] * 4
                )
            )
    finally:
        done.set()
        prober.join()
    # (the long ones are over the 2,048-token context too: the first chunk's count says so)
    for r in answers:
        assert _error(r, 400)["code"] == "context_length_exceeded"
    assert latencies and max(latencies) < 2.0, max(latencies)


# ---- 2. auth and body limits ---------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/metrics"),
        ("GET", "/version"),
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("GET", "/no/such/route"),
    ],
)
def test_every_endpoint_but_health_needs_the_key(server, method, path):
    r = httpx.request(method, server.url + path, json={"prompt": "x", "tokens": [1]})
    assert _error(r, 401)["code"] == "invalid_api_key"
    wrong = httpx.request(
        method, server.url + path, headers={"Authorization": f"Bearer {API_KEY}x"}
    )
    assert wrong.status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_chunked_body_past_the_limit_is_cut_off(server):
    """100 MB sent chunked (no Content-Length): refused with 413 once 32 MB have arrived."""
    sent = 0

    def body():
        nonlocal sent
        block = b"x" * 2**20
        for _ in range(100):
            sent += len(block)
            yield block

    t0 = time.monotonic()
    try:
        r = httpx.post(
            server.url + "/v1/completions",
            content=body(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
            timeout=30,
        )
        assert _error(r, 413)["code"] == "body_too_large"
    except httpx.TransportError:
        pass  # the server may close the connection before the client finished sending
    assert sent < 100 * 2**20 or time.monotonic() - t0 < 30
    assert httpx.get(server.url + "/health").status_code == 200


def test_declared_length_past_the_limit_is_413_without_reading(server):
    """A raw request declaring 64 MB gets its 413 before the body is sent."""
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {64 * 2**20}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.encode())
        reply = b""
        while b"body_too_large" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "body_too_large" in reply


def test_404_405_415_are_error_objects(http):
    assert _error(http.get("/v1/nothing"), 404)
    assert _error(http.get("/v1/completions"), 405)
    r = http.post("/v1/completions", content=b"prompt=x", headers={"Content-Type": "text/plain"})
    assert _error(r, 415)["code"] == "unsupported_media_type"


# ---- 3. admission counts sequences and prompt tokens --------------------------------------


def test_a_request_larger_than_the_server_is_a_400(http, model_name):
    # 8 running + 8 queued sequences: n=20 can never fit, nor 9 prompts x n=2.
    r = http.post("/v1/completions", json={"model": model_name, "prompt": "x", "n": 20})
    assert _error(r, 400)["code"] == "request_too_large"
    r = http.post(
        "/v1/completions",
        json={"model": model_name, "prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "i"], "n": 2},
    )
    assert _error(r, 400)["code"] == "request_too_large"
    r = http.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "x"}], "n": 17},
    )
    assert _error(r, 400)["code"] == "request_too_large"


def test_wide_requests_fill_the_queue_by_their_width(server, model_name):
    """Two streamed n=8 chats hold 16 sequences (8 running, 8 queued): a third request, even
    n=1, gets 429. (A chat stream's first chunk, the role, goes out once admitted.)"""
    body = {"model": model_name, "messages": [{"role": "user", "content": "Tell a story"}]}
    body |= {"n": 8, "max_tokens": 400, "ignore_eos": True, "temperature": 1.0, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = server.url + "/v1/chat/completions"
    a, b = httpx.Client(headers=headers, timeout=180), httpx.Client(headers=headers, timeout=180)
    with a, b, a.stream("POST", url, json=body) as r1, b.stream("POST", url, json=body) as r2:
        assert r1.status_code == r2.status_code == 200  # admitted: the 200 follows admission
        third = httpx.post(
            server.url + "/v1/completions",
            json={"model": model_name, "prompt": "x", "max_tokens": 1},
            headers=headers,
        )
        assert _error(third, 429)["type"] == "rate_limit_exceeded"
        assert third.headers["Retry-After"]
    # Hanging up released the 16 sequences.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        again = httpx.post(
            server.url + "/v1/completions",
            json={"model": model_name, "prompt": "x", "max_tokens": 1},
            headers=headers,
            timeout=60,
        )
        if again.status_code == 200:
            break
    assert again.status_code == 200


# ---- 7 and 10: protocol --------------------------------------------------------------------


def test_best_of_returns_the_likeliest_of_its_samples(http, model_name):
    common = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 8}
    common |= {"temperature": 1.0, "seed": 1234}
    all3 = http.post("/v1/completions", json={**common, "n": 3, "logprobs": 0}).json()
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in all3["choices"]]
    best = http.post("/v1/completions", json={**common, "best_of": 3}).json()
    assert len(best["choices"]) == 1 and best["choices"][0]["logprobs"] is None
    assert best["choices"][0]["text"] == all3["choices"][sums.index(max(sums))]["text"]
    assert best["usage"]["completion_tokens"] == all3["usage"]["completion_tokens"]
    r = http.post("/v1/completions", json={**common, "n": 2, "best_of": 1})
    assert _error(r, 400)["param"] == "best_of"
    r = http.post("/v1/completions", json={**common, "best_of": 2, "stream": True})
    assert _error(r, 400)["param"] == "best_of"


def test_continuous_usage_stats_put_usage_on_every_chunk(http, model_name):
    body = {"model": model_name, "prompt": "Count: one, two,", "max_tokens": 6}
    body |= {"temperature": 0, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert all("usage" in e for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(e["usage"]["prompt_tokens"] == events[0]["usage"]["prompt_tokens"] for e in events)


def test_cached_tokens_are_reported(http, model_name):
    prompt = "The history of the printing press begins " * 20
    body = {"model": model_name, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    http.post("/v1/completions", json=body)
    second = http.post("/v1/completions", json=body).json()["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] >= 16
    assert second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"stream_options": {"include_usage": True}}, None),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
    ],
)
def test_small_protocol_gaps_are_400s(http, model_name, body, param):
    r = http.post("/v1/completions", json={"model": model_name, "prompt": "x", **body})
    err = _error(r, 400)
    if param:
        assert err["param"] == param


def test_extreme_valid_seeds_work(http, model_name):
    for seed in (2**63 - 1, -(2**63)):
        r = http.post(
            "/v1/completions",
            json={"model": model_name, "prompt": "x", "max_tokens": 2, "seed": seed, "n": 2},
        )
        assert r.status_code == 200, r.text


# ---- 8. a client that hangs up frees its work ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_abandoned_requests_are_aborted_and_the_gauges_drain(server, http, model_name, stream):
    body = {"model": model_name, "prompt": "Write a long essay.", "max_tokens": 1500}
    body |= {"ignore_eos": True, "stream": stream}
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def abandon(_):
        try:
            if stream:
                with httpx.stream(
                    "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60
                ) as r:
                    next(r.iter_lines())
            else:
                httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=1.5)
        except httpx.TimeoutException:
            pass

    with cf.ThreadPoolExecutor(12) as pool:
        list(pool.map(abandon, range(12)))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (
            metric(http, "cadence:num_requests_running") == 0
            and metric(http, "cadence:num_requests_waiting") == 0
        ):
            break
        time.sleep(0.2)
    assert metric(http, "cadence:num_requests_running") == 0
    assert metric(http, "cadence:num_requests_waiting") == 0


def test_echo_with_logprobs_returns_the_prompt_tokens_logprobs(http, model_name):
    ids = http.post("/tokenize", json={"prompt": "The quick brown fox jumps over"}).json()
    ids = ids["tokens"]
    body = {"model": model_name, "prompt": ids, "max_tokens": 2, "temperature": 0}
    echoed = http.post("/v1/completions", json={**body, "echo": True, "logprobs": 3}).json()
    lp = echoed["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 2
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert echoed["choices"][0]["text"].startswith("The quick brown fox")
    assert lp["text_offset"][len(ids)] == len("".join(lp["tokens"][: len(ids)]))
    # Position j's prompt logprobs are what generating after the first j tokens would see.
    for j in (2, len(ids) - 1):
        alone = http.post(
            "/v1/completions", json={**body, "prompt": ids[:j], "max_tokens": 1, "logprobs": 3}
        ).json()["choices"][0]["logprobs"]["top_logprobs"][0]
        top = lp["top_logprobs"][j]
        assert set(top) == set(alone)
        assert all(abs(top[t] - alone[t]) < 1e-3 for t in top)
