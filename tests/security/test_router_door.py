"""The router's door, attacked: `cadence serve -dp 2 --api-key KEY` (two replicas of the
tiny model on the CPU behind the router).

- Every route but /health needs the key (/metrics, /v1/router/replicas included), checked
  before a byte of the body is read: an unauthenticated 400 MB upload is refused at once
  and the router's memory does not grow; an authenticated one is cut at the body cap.
- JSON nested deeper than the parser goes is a 400, not a 500.
- A client that hangs up ends its request on the replica, streamed or not.
- A replica that stops answering (SIGSTOP) ends the request it holds within a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
from attack_helpers import process_tree
from model_helpers import make_prompts
from server_helper import API_KEY, Server, children

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--device", "cpu", "--dtype", "float32", "--num-gpu-blocks-override", "256"]
ARGS += ["--max-model-len", "512", "--cpu-threads", "1"]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def dp(tiny_model_dir):
    """(the -dp 2 server, its replicas' URLs)."""
    srv = Server([tiny_model_dir("llama"), *ARGS, "-dp", "2", "--api-key", API_KEY])
    try:
        srv.wait_ready(300)
        status = httpx.get(srv.url + "/v1/router/replicas", headers=AUTH).json()
        yield srv, [r["url"] for r in status["replicas"]]
    finally:
        srv.stop()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def upload(port: int, headers: str, total: int, chunk: bytes = b"x" * (1 << 20)) -> str:
    """Send a POST declaring (or chunking) `total` bytes, reading all the while: the reply
    as soon as it comes (the server may answer, and close, before the body is through)."""
    reply = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:

        def read() -> None:
            try:
                while b"\r\n\r\n" not in reply and (got := s.recv(65536)):
                    reply.extend(got)
            except OSError:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        try:
            s.sendall(headers.encode())
            sent = 0
            while sent < total and not reply:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:  # (closed on us: the answer is in)
            pass
        reader.join(10)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    return reply.decode(errors="replace")


def test_every_route_but_health_needs_the_key(dp):
    srv, _ = dp
    with httpx.Client(base_url=srv.url, timeout=30) as anon:
        assert anon.get("/health").status_code == 200
        for method, path in (
            ("GET", "/metrics"),
            ("GET", "/v1/router/replicas"),
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
        ):
            r = anon.request(method, path, json={})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert anon.get("/metrics", headers=AUTH).status_code == 200
        evil = anon.get("/v1/models", headers={**AUTH, "Host": "attacker.example"})
        assert evil.status_code == 400  # a rebound name is not the router's
        body = {"prompt": [1, 2, 3], "max_tokens": 2}
        assert anon.post("/v1/completions", json=body, headers=AUTH).status_code == 200
        assert anon.get("/v1/models", headers=AUTH).json()["data"][0]["id"]
        # The router's own polls carry the key: the replicas' engine stats reach it.
        status = anon.get("/v1/router/replicas", headers=AUTH).json()["replicas"]
        assert all(r["healthy"] and r["last_error"] is None for r in status)


def test_a_huge_body_is_refused_before_it_is_read(dp):
    srv, _ = dp
    router_pid = srv.proc.pid
    before = rss_mib(router_pid)
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    unauth = upload(srv.port, head + f"Content-Length: {400 << 20}\r\n\r\n", 400 << 20)
    assert unauth.startswith("HTTP/1.1 401"), unauth[:200]
    authed = head + f"Authorization: Bearer {API_KEY}\r\n"
    declared = upload(srv.port, authed + f"Content-Length: {400 << 20}\r\n\r\n", 400 << 20)
    assert declared.startswith("HTTP/1.1 413"), declared[:200]
    chunked = upload(
        srv.port,
        authed + "Transfer-Encoding: chunked\r\n\r\n",
        400 << 20,
        b"100000\r\n" + b"x" * (1 << 20) + b"\r\n",
    )
    assert chunked.startswith("HTTP/1.1 413"), chunked[:200]
    assert rss_mib(router_pid) - before < 64  # (a body read whole would add 400 MiB)


def test_json_of_any_depth_is_a_400(dp):
    srv, _ = dp
    for raw in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, "{", "[]"):
        r = httpx.post(
            srv.url + "/v1/completions",
            content=raw,
            headers={**AUTH, "content-type": "application/json"},
        )
        assert r.status_code == 400, (raw[:10], r.status_code)
        assert r.json()["error"]["type"] == "invalid_request_error"


def running(urls: list[str]) -> int:
    return sum(
        httpx.get(u + "/v1/engine/stats", headers=AUTH).json()["requests"]["running"] for u in urls
    )


def wait_running(urls: list[str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while running(urls) == 0:  # until a replica works on it
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_ends_its_request_on_the_replica(dp, stream):
    srv, urls = dp
    prompt = make_prompts(512, [10], seed=91)[0]
    body = json.dumps({"prompt": prompt, "max_tokens": 400, "ignore_eos": True, "stream": stream})
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(head.encode() + body.encode())
        wait_running(urls)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    # (the client's connection is closed here, mid-answer)
    deadline = time.monotonic() + 30
    while running(urls):
        assert time.monotonic() < deadline, "the replica kept computing for a client that left"
        time.sleep(0.1)


def test_stopped_replicas_end_their_requests_within_a_bound(dp):
    """Both replicas SIGSTOPped (every process of theirs) while a streamed and a plain
    request run: each ends within a bound (502, or an SSE error event and [DONE])."""
    srv, urls = dp
    apis = [pid for pid, cmd in children(srv.proc.pid) if b"cadence::api" in cmd]
    assert len(apis) == 2
    results: dict[bool, dict] = {False: {}, True: {}}

    def ask(stream: bool) -> None:
        body = {"prompt": make_prompts(512, [10], seed=92)[0], "max_tokens": 300}
        body.update(ignore_eos=True, stream=stream)
        result = results[stream]
        t0 = time.monotonic()
        try:
            with httpx.stream(
                "POST", srv.url + "/v1/completions", json=body, headers=AUTH, timeout=120
            ) as r:
                result["status"] = r.status_code
                result["lines"] = [line for line in r.iter_lines() if line]
        finally:
            result["seconds"] = time.monotonic() - t0

    askers = [threading.Thread(target=ask, args=(stream,)) for stream in (False, True)]
    for t in askers:
        t.start()
    deadline = time.monotonic() + 30
    while running(urls) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stopped = [p for api in apis for p in process_tree(api)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        for t in askers:
            t.join(60)
            assert not t.is_alive()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    for stream, result in results.items():
        assert result["seconds"] < 30, result  # (the router gives a silent replica 8 s)
        if result["status"] == 200:  # a stream that had started: it ends with an error event
            assert stream, result
            error, done = result["lines"][-2:]
            message = json.loads(error.removeprefix("data: "))["error"]["message"]
            assert "stopped answering" in message and done == "data: [DONE]"
        else:
            assert result["status"] == 502, result
    deadline = time.monotonic() + 60  # back in rotation once they answer again
    while not all(
        r["healthy"]
        for r in httpx.get(srv.url + "/v1/router/replicas", headers=AUTH).json()["replicas"]
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
