"""The tensor-parallel step channel, attacked from the same host: a real `cadence serve -tp 2`
on the CPU (mp executor, gloo), its sockets found the way an attacker finds them (/proc).

- Nothing listens on a non-loopback address (torch.distributed's TCPStore used to listen
  on every interface; now ranks meet through a file in a private directory).
- The step channel's ipc sockets live in a 0700 directory: another user cannot connect.
- Even a process of the same user that connects gets nothing: every socket is a CURVE
  server that admits only this launch's key, so a pickle sent in never arrives (and would
  not be unpickled: msgspec), and a PULL socket that would steal step messages (prompt
  token ids; the rank that missed them would hang) receives nothing.
- Throughout, the engine keeps stepping: greedy output equals what it gave before.
"""

from __future__ import annotations

import contextlib
import os
import socket

import httpx
import pytest
import zmq
from attack_helpers import (
    as_other_user,
    listening_endpoints,
    pickle_payloads,
    raw_poke,
    zmtp_greeting,
)
from model_helpers import make_prompts
from server_helper import Server

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["-tp", "2", "--device", "cpu", "--dtype", "float32", "--max-model-len", "256"]
ARGS += ["--num-gpu-blocks-override", "64"]


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir):
    srv = Server([tiny_model_dir("llama"), *ARGS])
    try:
        srv.wait_ready(300)
        yield srv
    finally:
        srv.stop()


def greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    for p in prompts:
        body = {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["logprobs"]["tokens"])
    return out


def test_nothing_listens_beyond_loopback(tp_server):
    tcp, unix = listening_endpoints(tp_server.proc.pid)
    assert tcp, "the HTTP server at least"
    assert all(addr in ("127.0.0.1", "::1") for addr, _ in tcp), tcp
    step_sockets = [p for p in unix if "cadence-tp-" in p]
    assert len(step_sockets) == 2, unix  # rank 1's step socket and the control socket
    for path in step_sockets:
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700


def test_a_stranger_on_the_channel_runs_nothing_hears_nothing_and_stalls_nothing(
    tp_server, tmp_path
):
    prompts = make_prompts(512, [5, 17, 40], seed=71)
    want = greedy(tp_server.url, prompts)
    marker = tmp_path / "pwned"
    tcp, unix = listening_endpoints(tp_server.proc.pid)
    ctx = zmq.Context()
    listeners, sockets = [], []
    try:
        # Every endpoint but the HTTP port and the API server's own sockets (same-user
        # reachable by design: see the docstring of the other-user test below).
        targets = [f"ipc://{p}" for p in unix if "cadence-tp-" in p]
        targets += [f"tcp://{a}:{port}" for a, port in tcp if port != tp_server.port]
        for target in targets:
            # A plain ZMQ peer (no CURVE keys) and one with keys of its own making.
            for keys in (None, zmq.curve_keypair()):
                push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
                sockets += [push, pull]
                for s in (push, pull):
                    s.setsockopt(zmq.LINGER, 0)
                    if keys is not None:
                        s.curve_publickey, s.curve_secretkey = keys
                        s.curve_serverkey = zmq.curve_keypair()[0]
                    s.connect(target)
                for payload in pickle_payloads(str(marker)):
                    _try_send(push, payload)
                listeners.append(pull)
        for addr in tcp:  # gloo's pair listeners: raw bytes, a ZMTP greeting
            if addr[1] == tp_server.port:
                continue
            for payload in pickle_payloads(str(marker)):
                raw_poke(addr, payload)
                raw_poke(addr, zmtp_greeting() + payload)
        # The engine keeps stepping, with the same results; nothing ran, nothing leaked.
        assert greedy(tp_server.url, prompts) == want
        assert greedy(tp_server.url, prompts[:1]) == want[:1]
        assert not marker.exists()
        assert not any(pull.poll(200) for pull in listeners)
        assert httpx.get(tp_server.url + "/health").status_code == 200
    finally:
        for s in sockets:
            s.close(linger=0)
        ctx.term()


def _try_send(sock: zmq.Socket, payload: bytes) -> None:
    # (zmq.Again: no completed connection to queue it on, as CURVE refused us)
    with contextlib.suppress(zmq.Again):
        sock.send(payload, zmq.NOBLOCK)


def _connect_unix(paths: list[str]) -> dict:
    """(The engine's sockets to the API server are reachable by their own user, like the
    processes themselves (which that user may debug anyway); by no one else.)"""
    out = {}
    for path in paths:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path)
                out[path] = "connected"
            except OSError as e:
                out[path] = type(e).__name__
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user (nobody)")
def test_another_user_cannot_reach_the_engines_sockets(tp_server):
    _, unix = listening_endpoints(tp_server.proc.pid)
    assert unix
    result = as_other_user(_connect_unix, unix)
    assert set(result.values()) == {"PermissionError"}, result
