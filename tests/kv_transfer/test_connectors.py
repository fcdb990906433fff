"""Disaggregated prefill/decode between two engines in one process, over the TCP and the
shared-memory connectors:
the decode engine's float32 greedy output equals transformers', whatever the prompt length
(one block or many), with prefix-cache hits on either side, a failed transfer (it computes
the prompt itself) or an abort while loading; and it computes only each prompt's last
token itself."""

from __future__ import annotations

import os
import time

import pytest
from model_helpers import hf_greedy, make_prompts

from cadence import LLM, SamplingParams

NEW_TOKENS = 12
SECRET = "test-deployment-secret-0123"
ENGINE = dict(
    dtype="float32",
    num_gpu_blocks_override=128,
    check_kv_integrity=True,
    kv_transfer_secret=SECRET,
)


@pytest.fixture(scope="module", params=["tcp", "shm"])
def engines(tiny_model_dir, request):
    """Both connectors: bytes over ZMQ, and shared memory files on the same host."""
    path = tiny_model_dir("llama")
    prefill = LLM(path, kv_role="prefill", kv_connector=request.param, **ENGINE)
    decode = LLM(path, kv_role="decode", kv_connector=request.param, **ENGINE)
    yield path, prefill.engine, decode.engine
    prefill.engine.shutdown()
    decode.engine.shutdown()


def run(core, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
    while core.has_unfinished_requests():
        for u in core.step():
            out[u.request_id] += u.new_token_ids
    return out


def disaggregated(prefill, decode, prompts: list[list[int]], tag: str, tids=None) -> list:
    addr = prefill.kv_connector.addr
    tids = tids or [f"{tag}-{i}" for i in range(len(prompts))]
    first = {}
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=1)
        params.kv_transfer_params = {"do_remote_decode": True, "transfer_id": f"{tag}-{i}"}
        first[f"p-{tag}-{i}"] = (p, params)
    run(prefill, first)
    assert prefill.kv_connector.num_staged >= len(prompts)
    second = {}
    for i, (p, tid) in enumerate(zip(prompts, tids)):
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        params.kv_transfer_params = {
            "do_remote_prefill": True,
            "remote_addr": addr,
            "transfer_id": tid,
        }
        second[f"d-{tag}-{i}"] = (p, params)
    out = run(decode, second)
    return [out[f"d-{tag}-{i}"] for i in range(len(prompts))]


def test_decode_engine_output_equals_transformers(engines, hf_model):
    path, prefill, decode = engines
    prompts = make_prompts(512, [5, 17, 40, 64, 33], seed=41)
    want = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    before = decode.timeline.num_steps
    loaded = decode.scheduler.remote.stats.num_loaded_tokens
    assert disaggregated(prefill, decode, prompts, "a") == want
    # The decode engine computed one prompt token per request; the rest was loaded.
    steps = decode.timeline.snapshot(since=before)
    assert sum(s["prefill_tokens"] for s in steps) == len(prompts)
    assert decode.scheduler.remote.stats.num_loaded_tokens - loaded == sum(
        len(p) - 1 for p in prompts
    )


def test_prefix_hits_on_both_sides(engines, hf_model):
    path, prefill, decode = engines
    trunk = make_prompts(512, [48], seed=42)[0]
    first = [trunk + q for q in make_prompts(512, [7, 20], seed=43)]
    later = [trunk + q for q in make_prompts(512, [9, 26], seed=44)]
    assert disaggregated(prefill, decode, first, "b") == [
        hf_greedy(hf_model(path), p, NEW_TOKENS) for p in first
    ]
    hits_p, hits_d = prefill.kv.stats.hits, decode.kv.stats.hits
    loaded = decode.scheduler.remote.stats.num_loaded_tokens
    assert disaggregated(prefill, decode, later, "c") == [
        hf_greedy(hf_model(path), p, NEW_TOKENS) for p in later
    ]
    assert prefill.kv.stats.hits - hits_p >= 2 * 48  # the prefill engine reused the trunk
    assert decode.kv.stats.hits - hits_d >= 2 * 48  # and the decode engine had it already
    assert decode.scheduler.remote.stats.num_loaded_tokens - loaded == sum(
        len(p) - 1 - 48 for p in later
    )


def test_fetched_transfers_leave_nothing_behind(engines):
    """Each staged transfer is taken once; a shared-memory file goes when released."""
    _, prefill, _ = engines
    connector = prefill.kv_connector
    deadline = time.monotonic() + 5
    while connector.num_staged:  # (shm: fetched files wait for their reader's release)
        assert time.monotonic() < deadline, connector.num_staged
        time.sleep(0.01)
    if hasattr(connector, "_dir"):  # the engine's own 0700 directory, empty again
        assert os.stat(connector._dir).st_mode & 0o777 == 0o700
        assert os.listdir(connector._dir) == []


def test_a_failed_transfer_computes_the_prompt_locally(engines, hf_model):
    path, prefill, decode = engines
    prompts = make_prompts(512, [30], seed=45)
    failed = decode.scheduler.remote.stats.num_failed_loads
    out = disaggregated(prefill, decode, prompts, "e", tids=["no-such-transfer"])
    assert out == [hf_greedy(hf_model(path), prompts[0], NEW_TOKENS)]
    assert decode.scheduler.remote.stats.num_failed_loads == failed + 1


def test_an_abort_while_loading_frees_the_blocks_when_the_load_ends(engines):
    _, prefill, decode = engines
    prompt = make_prompts(512, [70], seed=46)[0]
    params = SamplingParams(temperature=0, max_tokens=1)
    params.kv_transfer_params = {"do_remote_decode": True, "transfer_id": "f"}
    run(prefill, {"pf": (prompt, params)})
    params = SamplingParams(temperature=0, max_tokens=4)
    params.kv_transfer_params = {
        "do_remote_prefill": True,
        "remote_addr": prefill.kv_connector.addr,
        "transfer_id": "f",
    }
    decode.add_request("df", prompt, params)
    decode.step()  # starts the load
    assert "df" in decode.scheduler.remote.loading
    decode.abort(["df"])
    while decode.has_unfinished_requests():
        assert decode.step() == []
    assert decode.kv.num_free_blocks == decode.kv.pool.num_blocks


def test_samples_of_one_prompt_share_one_load(engines, hf_model):
    """n samples of a prompt are n requests with one transfer id: the first loads it, the
    others follow and find its blocks in the prefix cache; an aborted follower just goes."""
    path, prefill, decode = engines
    prompt = make_prompts(512, [50], seed=47)[0]
    params = SamplingParams(temperature=0, max_tokens=1)
    params.kv_transfer_params = {"do_remote_decode": True, "transfer_id": "g"}
    run(prefill, {"pg": (prompt, params)})
    stats = decode.scheduler.remote.stats
    loads, failed, hits = stats.num_loads, stats.num_failed_loads, decode.kv.stats.hits
    for i in range(3):
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        params.kv_transfer_params = {
            "do_remote_prefill": True,
            "remote_addr": prefill.kv_connector.addr,
            "transfer_id": "g",
        }
        decode.add_request(f"g{i}", prompt, params)
    out = {f"g{i}": [] for i in range(3)}
    for u in decode.step():  # starts the load; the others follow it
        out[u.request_id] += u.new_token_ids
    assert decode.scheduler.remote.num_held == 3
    decode.abort(["g2"])
    while decode.has_unfinished_requests():
        for u in decode.step():
            out[u.request_id] += u.new_token_ids
    want = hf_greedy(hf_model(path), prompt, NEW_TOKENS)
    assert out == {"g0": want, "g1": want, "g2": []}
    assert (stats.num_loads, stats.num_failed_loads) == (loads + 1, failed)
    assert decode.kv.stats.hits - hits >= 48  # g1 took g0's loaded blocks (3 of 16 tokens)
    assert decode.kv.num_free_blocks == decode.kv.pool.num_blocks
    # A sibling that comes after the load ended takes the cached blocks, loads nothing.
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    params.kv_transfer_params = {
        "do_remote_prefill": True,
        "remote_addr": prefill.kv_connector.addr,
        "transfer_id": "g",
    }
    assert run(decode, {"g3": (prompt, params)}) == {"g3": want}
    assert (stats.num_loads, stats.num_failed_loads) == (loads + 1, failed)


def test_a_transfer_id_staged_twice_keeps_one_copy_and_serves_the_last(engines, hf_model):
    """A reused id replaces the staged K/V (the old copy, and its file, go at once); the
    fetch gets the newer prompt's K/V; nothing is left behind after it."""
    path, prefill, decode = engines
    first, second = make_prompts(512, [40, 40], seed=48)
    connector = prefill.kv_connector
    held = connector.num_staged  # (transfers earlier tests left unfetched)
    files = set(os.listdir(connector._dir)) if hasattr(connector, "_dir") else set()
    for prompt in (first, second):
        params = SamplingParams(temperature=0, max_tokens=1)
        params.kv_transfer_params = {"do_remote_decode": True, "transfer_id": "dup"}
        run(prefill, {"p-dup": (prompt, params)})
    assert connector.num_staged == held + 1
    if hasattr(connector, "_dir"):  # one new file, the engine's own, 0600
        (new,) = set(os.listdir(connector._dir)) - files
        assert os.stat(os.path.join(connector._dir, new)).st_mode & 0o777 == 0o600
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    params.kv_transfer_params = {
        "do_remote_prefill": True,
        "remote_addr": connector.addr,
        "transfer_id": "dup",
    }
    failed = decode.scheduler.remote.stats.num_failed_loads
    want = hf_greedy(hf_model(path), second, NEW_TOKENS)
    assert run(decode, {"d-dup": (second, params)}) == {"d-dup": want}
    assert decode.scheduler.remote.stats.num_failed_loads == failed
    deadline = time.monotonic() + 5
    while connector.num_staged > held:  # released after the load
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("tid", ["x/y", "../../etc/passwd", "", 7])
def test_a_bad_transfer_id_is_a_clear_error_offline(engines, tid):
    _, prefill, _ = engines
    params = SamplingParams(temperature=0, max_tokens=1)
    params.kv_transfer_params = {"do_remote_decode": True, "transfer_id": tid}
    with pytest.raises(ValueError, match="transfer_id"):
        prefill.add_request("bad-tid", [1, 2, 3], params)
    assert not prefill.has_unfinished_requests()
