"""Disaggregated serving, attacked: real `cadence serve --kv-role prefill|decode` servers
(CPU, TCP connector), a client that talks to them directly, a fake prefill peer, and a
fuzzer on the K/V port.

- A client's own kv_transfer_params is a 403 (only the router's signed ones are taken):
  the decode engine connects nowhere, and the cache stays clean (the next normal request
  hits nothing and gives a plain engine's greedy output).
- Signed params are fresh and used once (a replay is a 403).
- A fake peer at a signed address cannot feed K/V: it does not hold the deployment's
  keys, the load fails, the decode engine computes the prompt itself (correct output).
- Transfer ids that would be paths, or not ids at all, are 4xx; concurrent streams on
  that engine finish; the engine stays up.
- Garbage, plain ZMQ peers and malformed frames at the K/V port leave its server thread
  serving the next real transfer.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import uuid

import httpx
import pytest
import zmq
from attack_helpers import raw_poke, zmtp_greeting
from model_helpers import make_prompts
from router_helper import KV_ENV, KV_SECRET, router
from server_helper import Server

from cadence.channel_auth import keys_from_secret, make_client
from cadence.kv_transfer.params import sign

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--device", "cpu", "--cpu-threads", "1", "--dtype", "float32"]
ARGS += ["--num-gpu-blocks-override", "256", "--max-model-len", "512"]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    servers = [
        Server([tiny_model_dir("llama"), *ARGS, "--kv-role", role], env=KV_ENV)
        for role in ("prefill", "decode")
    ]
    try:
        for s in servers:
            s.wait_ready(300)
        prefill, decode = servers
        addr = httpx.get(prefill.url + "/version").json()["kv_transfer"]["addr"]
        yield prefill, decode, addr
    finally:
        for s in servers:
            s.stop()


class FakePeer:
    """A K/V server of the attacker's: answers any fetch with a header and junk K/V."""

    def __init__(self, keys=None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        if keys is not None:  # keys of some other deployment
            self.sock.curve_server = True
            self.sock.curve_publickey, self.sock.curve_secretkey = keys
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.addr = f"tcp://127.0.0.1:{port}"
        self.fetches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self.sock.poll(100):
                msg = self.sock.recv_multipart()
                self.fetches += 1
                self.sock.send_multipart([msg[0], b'{"ok": true, "num_blocks": 1}', b"\0" * 64])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close(0)
        self.ctx.term()


def body(prompt: list[int], **extra) -> dict:
    return {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **extra}


def kv_stats(server: Server) -> dict:
    return httpx.get(server.url + "/v1/engine/stats").json()["kv_transfer"]


def test_a_clients_own_kv_transfer_params_are_refused_and_the_cache_stays_clean(engines):
    prefill, decode, _ = engines
    prompt = make_prompts(512, [40], seed=81)[0]
    peer = FakePeer()
    try:
        forged = {"do_remote_prefill": True, "remote_addr": peer.addr, "transfer_id": "t1"}
        for params in (
            forged,
            {**forged, "signature": "0" * 64, "issued_at": 0},  # a made-up signature
            sign(forged, "some-other-deployment-secret"),
        ):
            r = httpx.post(
                decode.url + "/v1/completions", json=body(prompt, kv_transfer_params=params)
            )
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "kv_transfer_forbidden"
        for params in ({"do_remote_decode": True, "transfer_id": "mine"},):  # prefill side too
            r = httpx.post(
                prefill.url + "/v1/completions", json=body(prompt, kv_transfer_params=params)
            )
            assert r.status_code == 403, r.text
        assert peer.fetches == 0
    finally:
        peer.close()
    # The same prompt, asked normally: nothing cached from the attempt, a plain answer.
    want = httpx.post(prefill.url + "/v1/completions", json=body(prompt)).json()
    got = httpx.post(decode.url + "/v1/completions", json=body(prompt)).json()
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_signed_params_are_used_once(engines):
    _, decode, addr = engines
    prompt = make_prompts(512, [20], seed=82)[0]
    signed = sign(
        {"do_remote_prefill": True, "remote_addr": addr, "transfer_id": "once"}, KV_SECRET
    )
    first = httpx.post(decode.url + "/v1/completions", json=body(prompt, kv_transfer_params=signed))
    assert first.status_code == 200  # (nothing staged under it: computed locally)
    again = httpx.post(decode.url + "/v1/completions", json=body(prompt, kv_transfer_params=signed))
    assert again.status_code == 403 and "used already" in again.json()["error"]["message"]
    stale = sign({"do_remote_decode": True, "transfer_id": "old"}, KV_SECRET, now=1.0)
    r = httpx.post(decode.url + "/v1/completions", json=body(prompt, kv_transfer_params=stale))
    assert r.status_code == 403 and "expired" in r.json()["error"]["message"]


def test_a_fake_prefill_peer_cannot_feed_k_v(engines):
    """Even at an address the router signed (a port squatted after a prefill engine died):
    the peer cannot complete the CURVE handshake, so the load fails and the decode engine
    computes the prompt itself."""
    prefill, decode, _ = engines
    prompt = make_prompts(512, [50], seed=83)[0]
    want = httpx.post(prefill.url + "/v1/completions", json=body(prompt)).json()
    for keys in (None, zmq.curve_keypair()):
        peer = FakePeer(keys)
        failed = kv_stats(decode)["failed_loads"]
        try:
            params = {
                "do_remote_prefill": True,
                "remote_addr": peer.addr,
                "transfer_id": uuid.uuid4().hex,
            }
            r = httpx.post(
                decode.url + "/v1/completions",
                json=body(prompt, kv_transfer_params=sign(params, KV_SECRET)),
                timeout=120,
            )
        finally:
            peer.close()
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want["choices"][0]["text"]
        assert peer.fetches == 0  # its socket never saw a fetch
        assert kv_stats(decode)["failed_loads"] == failed + 1


@pytest.mark.parametrize("tid", ["x/y", "../../etc/passwd", "", " ", "a" * 200, "ü", ".hidden"])
def test_bad_transfer_ids_are_4xx_and_streams_finish(engines, tid):
    prefill, decode, _ = engines
    prompt = make_prompts(512, [30], seed=84)[0]

    def stream() -> str:
        with httpx.stream(
            "POST",
            prefill.url + "/v1/completions",
            json=body(prompt, stream=True, max_tokens=24),
            timeout=60,
        ) as r:
            return [line for line in r.iter_lines() if line][-1]

    with cf.ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(stream) for _ in range(2)]
        for server, params in (
            (prefill, {"do_remote_decode": True, "transfer_id": tid}),
            (
                decode,
                {"do_remote_prefill": True, "remote_addr": "tcp://127.0.0.1:9", "transfer_id": tid},
            ),
        ):
            r = httpx.post(
                server.url + "/v1/completions",
                json=body(prompt, kv_transfer_params=sign(params, KV_SECRET)),
            )
            assert r.status_code == 400, r.text
            assert "transfer_id" in r.json()["error"]["message"]
        assert [s.result() for s in streams] == ["data: [DONE]"] * 2
    assert httpx.get(prefill.url + "/health").status_code == 200


def test_one_prompt_per_transfer(engines):
    _, decode, addr = engines
    params = sign({"do_remote_prefill": True, "remote_addr": addr, "transfer_id": "two"}, KV_SECRET)
    r = httpx.post(
        decode.url + "/v1/completions", json=body([[1, 2, 3], [4, 5, 6]], kv_transfer_params=params)
    )
    assert r.status_code == 400 and "one prompt" in r.json()["error"]["message"]


def test_the_k_v_server_survives_garbage_and_serves_the_next_transfer(engines):
    prefill, decode, addr = engines
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    raw_poke((host, int(port)), b"\x00garbage" * 100)
    raw_poke((host, int(port)), zmtp_greeting() + b"\x01" * 300)
    ctx = zmq.Context()
    try:
        plain = ctx.socket(zmq.DEALER)  # a plain ZMQ peer: never gets an answer
        plain.connect(addr)
        plain.send_multipart([b"t", b"0", b"1"])
        assert not plain.poll(500)
        # A peer that holds the keys (a buggy decode engine) sends malformed fetches.
        insider = ctx.socket(zmq.DEALER)
        make_client(
            insider,
            keys_from_secret(KV_SECRET, "kv-client"),
            keys_from_secret(KV_SECRET, "kv-server").public,
        )
        insider.connect(addr)
        for frames in (
            [b"only-one"],
            [b"x/y", b"0", b"1"],
            [b"\xff\xfe", b"0", b"1"],
            [b"t", b"-1", b"1"],
            [b"t", b"1" * 40, b"1"],
            [b"release", b"\xff"],
            [b"a", b"b", b"c", b"d", b"e"],
        ):
            insider.send_multipart(frames)
            if frames[0] != b"release":
                assert insider.poll(5000), frames
                assert b'"ok": false' in insider.recv_multipart()[0]
        for s in (plain, insider):
            s.close(0)
    finally:
        ctx.term()
    # The next real transfer, through the router: loaded, not failed.
    prompt = make_prompts(512, [60], seed=85)[0]
    want = httpx.post(prefill.url + "/v1/completions", json=body(prompt)).json()["choices"][0][
        "text"
    ]
    before = kv_stats(decode)
    with router([decode.url], "round-robin", prefill=[prefill.url]) as url:
        got = httpx.post(url + "/v1/completions", json=body(prompt), timeout=120).json()
    assert got["choices"][0]["text"] == want
    after = kv_stats(decode)
    assert after["loads"] == before["loads"] + 1 and after["failed_loads"] == before["failed_loads"]
