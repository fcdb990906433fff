"""Disaggregated prefill/decode: `cadence serve --kv-role prefill`, `cadence serve --kv-role
decode` and `cadence router --prefill URL --decode URL`, the K/V moving over the TCP
connector or through shared memory on the CPU; on a GPU machine also from GPU to GPU
(CUDA IPC; both engines on one GPU, and on two when there are two). Float32 greedy output
equals a single engine's, streamed or not, for prompts of one block or many; prefix caches
hit on both sides; the engines' /metrics count what moved."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from model_helpers import make_prompts
from router_helper import KV_ENV, router
from server_helper import Server, metric

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

ARGS = ["--dtype", "float32", "--num-gpu-blocks-override", "256", "--max-model-len", "512"]
CPU = ["--device", "cpu", "--cpu-threads", "1"]
NUM_GPUS = torch.cuda.device_count()


def on_gpu(connector: str, gpus: int = 1):
    why = "needs a CUDA device" if gpus == 1 else "needs two CUDA devices"
    marks = [pytest.mark.gpu, pytest.mark.skipif(gpus > NUM_GPUS, reason=why)]
    return pytest.param(("cuda", connector, gpus), marks=marks, id=f"cuda{gpus}-{connector}")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("cpu", "tcp", 0), id="cpu-tcp"),
        pytest.param(("cpu", "shm", 0), id="cpu-shm"),
        on_gpu("tcp"),
        on_gpu("shm"),
        on_gpu("cuda_ipc"),
        on_gpu("cuda_ipc", gpus=2),
    ],
)
def pd(tiny_model_dir, request):
    """(router URL, prefill server, decode server), over each connector and device. With
    two GPUs the decode engine runs on the second and sees the first (its K/V source)."""
    device, connector, gpus = request.param
    flags = CPU if device == "cpu" else ["--device", "cuda"]
    envs = [KV_ENV, KV_ENV]
    if gpus == 2:
        envs = [{**KV_ENV, "CUDA_VISIBLE_DEVICES": "0"}, {**KV_ENV, "CUDA_VISIBLE_DEVICES": "1,0"}]
    servers = [
        Server(
            [
                tiny_model_dir("llama"),
                *ARGS,
                *flags,
                "--kv-role",
                role,
                "--kv-connector",
                connector,
            ],
            env=env,
        )
        for role, env in zip(("prefill", "decode"), envs)
    ]
    try:
        for s in servers:
            s.wait_ready(300)
        prefill, decode = servers
        assert (
            httpx.get(prefill.url + "/version").json()["kv_transfer"]["addr"].startswith("tcp://")
        )
        with router([decode.url], "cache-aware", prefill=[prefill.url]) as url:
            yield url, prefill, decode
    finally:
        for s in servers:
            s.stop()


def complete(url: str, prompt, stream: bool = False, max_tokens: int = 12) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def prefill_tokens_since(server: Server, step: int) -> int:
    steps = httpx.get(server.url + "/v1/engine/steps", params={"since": step, "limit": 10000})
    return sum(s["prefill_tokens"] for s in steps.json()["steps"])


def last_step(server: Server) -> int:
    return httpx.get(server.url + "/v1/engine/stats").json()["num_steps"]


def kv_transfer(server: Server) -> dict:
    return httpx.get(server.url + "/v1/engine/stats").json()["kv_transfer"]


def test_output_equals_a_single_engine(pd):
    url, prefill, decode = pd
    prompts = make_prompts(512, [5, 17, 40, 64, 100], seed=51)
    # One engine alone (the prefill engine: the decode engine's cache stays cold, so it
    # loads every prompt but its last token).
    want = [complete(prefill.url, p) for p in prompts]
    mark = last_step(decode)
    saved, loaded = kv_transfer(prefill), kv_transfer(decode)
    got = [complete(url, p, stream=i % 2 == 1) for i, p in enumerate(prompts)]
    assert got == want
    # Through the router the decode engine computed only each prompt's last token.
    assert prefill_tokens_since(decode, mark) == len(prompts)
    # What moved, as both engines count it (in /metrics too: engine_view reads the same).
    after = kv_transfer(decode)
    assert after["loads"] - loaded["loads"] == len(prompts)
    assert after["loaded_tokens"] - loaded["loaded_tokens"] == sum(len(p) - 1 for p in prompts)
    assert after["failed_loads"] == loaded["failed_loads"]
    assert after["load_seconds"] > loaded["load_seconds"]
    saved_now = kv_transfer(prefill)["saved_tokens"]
    assert saved_now - saved["saved_tokens"] == sum(len(p) for p in prompts)
    m = httpx.Client(base_url=decode.url)
    assert metric(m, "cadence:kv_transfer_loaded_tokens_total") == after["loaded_tokens"]


def test_prefix_caches_hit_on_both_sides(pd):
    url, prefill, decode = pd
    trunk = make_prompts(512, [64], seed=52)[0]
    prompts = [trunk + q for q in make_prompts(512, [6, 9, 12], seed=53)]
    hits = [
        metric(httpx.Client(base_url=s.url), "cadence:prefix_cache_hits_total")
        for s in (prefill, decode)
    ]
    want = [complete(decode.url, p) for p in prompts]  # also leaves the trunk in its cache
    after_ref = metric(httpx.Client(base_url=decode.url), "cadence:prefix_cache_hits_total")
    assert [complete(url, p) for p in prompts] == want
    prefill_hits = metric(httpx.Client(base_url=prefill.url), "cadence:prefix_cache_hits_total")
    decode_hits = metric(httpx.Client(base_url=decode.url), "cadence:prefix_cache_hits_total")
    assert prefill_hits - hits[0] >= 2 * 64  # the 2nd and 3rd prompts reuse the trunk there
    assert decode_hits - after_ref >= 3 * 64  # the decode engine loads only past its trunk


def test_a_bad_request_is_answered_by_the_prefill_engine(pd):
    url, _, _ = pd
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_without_a_reachable_prefill_engine_the_decode_engine_computes(pd, tiny_model_dir):
    _, _, decode = pd
    prompts = make_prompts(512, [20, 45], seed=54)
    want = [complete(decode.url, p) for p in prompts]
    failed = kv_transfer(decode)["failed_loads"]
    with router([decode.url], "round-robin", prefill=["http://127.0.0.1:9"]) as url:
        assert httpx.get(url + "/health").status_code == 200
        assert [complete(url, p) for p in prompts] == want
        # kv_transfer_params is the router's field: a client's own never reaches an engine
        # (else a client could make a decode engine load K/V from any address).
        forged = {"do_remote_prefill": True, "remote_addr": "tcp://127.0.0.1:9", "transfer_id": "x"}
        body = {"prompt": prompts[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        r = httpx.post(url + "/v1/completions", json={**body, "kv_transfer_params": forged})
        assert r.json()["choices"][0]["text"] == want[0]
    assert kv_transfer(decode)["failed_loads"] == failed


def test_n_samples_take_the_prompt_from_one_transfer(pd):
    url, prefill, decode = pd
    prompt = make_prompts(512, [70], seed=55)[0]
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    want = httpx.post(prefill.url + "/v1/completions", json=body, timeout=120).json()
    before = kv_transfer(decode)
    r = httpx.post(url + "/v1/completions", json={**body, "n": 3}, timeout=120)
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in r.json()["choices"]]
    assert texts == [want["choices"][0]["text"]] * 3
    after = kv_transfer(decode)
    assert after["loads"] - before["loads"] == 1  # one load, the other samples follow it
    assert after["failed_loads"] == before["failed_loads"]
