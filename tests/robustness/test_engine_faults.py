"""A failing engine step is contained (issue 14, point 5).

In the core: a step that raises ends only the requests of that step; queued requests and
new ones then produce exactly the tokens of an engine that never failed. In a real server:
the failed requests get a 500 (or an SSE error event and [DONE]) while /health stays 200;
MAX_CONSECUTIVE_STEP_FAILURES failures in a row, or a wedged step, end the engine and the
server (non-zero). Faults come from the test-only hook (CADENCE_FAULT_FILE).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from engine_helpers import arm, wait_exit, wait_gone
from model_helpers import make_prompts
from server_helper import Server, worker_threads

from cadence.config import EngineConfig
from cadence.engine.core import EngineCore
from cadence.engine.core_proc import MAX_CONSECUTIVE_STEP_FAILURES
from cadence.engine.faults import ENV_VAR, InjectedFault, install_from_env
from cadence.sampling_params import SamplingParams

NEW_TOKENS = 24


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


def run_to_end(core: EngineCore, outputs: dict[str, list[int]]) -> None:
    while core.has_unfinished_requests():
        for up in core.step():
            outputs.setdefault(up.request_id, []).extend(up.new_token_ids)


# ---- the core ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"async_scheduling": False},
        {"async_scheduling": True},
        {"async_scheduling": True, "prefix_cache": "radix"},
    ],
    ids=["sync", "async", "async-radix"],
)
def test_a_failed_step_ends_its_requests_and_the_rest_run_as_if_it_never_happened(
    tiny_model_dir, tmp_path, monkeypatch, kw
):
    fault = tmp_path / "fault"
    monkeypatch.setenv(ENV_VAR, str(fault))
    config = EngineConfig.from_kwargs(
        model=tiny_model_dir("llama"),
        dtype="float32",
        num_gpu_blocks_override=64,
        max_num_seqs=2,
        check_kv_integrity=True,
        **kw,
    )
    core = EngineCore(config)
    install_from_env(core)
    prompts = make_prompts(core.vocab_size, [20, 33, 17], seed=3)

    # Reference tokens (they also fill the prefix cache the failure must not poison).
    expected: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        core.add_request(f"ref{i}", p, greedy())
    run_to_end(core, expected)

    # Two requests decoding, a third queued behind max_num_seqs=2; then a step fails.
    got: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", p, greedy())
    for _ in range(4):
        for up in core.step():
            got.setdefault(up.request_id, []).extend(up.new_token_ids)
    arm(fault, "raise")
    with pytest.raises(InjectedFault):
        core.step()
    ended = core.fail_step()
    assert ended == ["r0", "r1"], "only the running batch is ended"
    assert set(core.scheduler.requests) == {"r2"}, "the queued request stays"

    # The queued request and a fresh copy of a failed one give the reference tokens.
    core.add_request("again0", prompts[0], greedy())
    got = {}
    run_to_end(core, got)
    assert got["r2"] == expected["ref2"]
    assert got["again0"] == expected["ref0"]
    # (The runner hears of the last finished requests with the next schedule.)
    assert not {"r0", "r1"} & set(core.runner.request_ids()), "the failed requests' rows are gone"
    assert core.kv.num_free_blocks == core.runner.num_blocks


def test_a_request_the_failed_step_finished_unheard_gets_its_error_too(tiny_model_dir):
    """Async scheduling: the step reads back the step in flight (which finishes r0), then
    fails launching its own sampling. r0's finish never went out: it must get the error."""
    config = EngineConfig.from_kwargs(
        model=tiny_model_dir("llama"),
        dtype="float32",
        num_gpu_blocks_override=64,
        async_scheduling=True,
        check_kv_integrity=True,
    )
    core = EngineCore(config)
    core.add_request("r0", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2))
    core.add_request("r1", [4, 5, 6], greedy())
    sample_async = core.runner.sample_async
    calls = []

    def failing_third_launch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the step that reads r0's last token back
            raise RuntimeError("device error")
        return sample_async(*args, **kwargs)

    core.runner.sample_async = failing_third_launch
    got: dict[str, list[int]] = {}
    with pytest.raises(RuntimeError, match="device error"):
        for _ in range(3):
            for up in core.step():
                got.setdefault(up.request_id, []).extend(up.new_token_ids)
    assert len(got.get("r0", [])) < 2, "r0's finish was computed but never returned"
    assert core.fail_step() == ["r0", "r1"]
    assert not core.has_unfinished_requests()


# ---- a real server ----------------------------------------------------------------------


def start_server(tiny_model_dir, fault, *extra: str) -> Server:
    srv = Server(
        [
            tiny_model_dir("llama"),
            "--num-gpu-blocks-override",
            "256",
            "--max-model-len",
            "512",
            "--dtype",
            "float32",
            *extra,
        ],
        env={ENV_VAR: str(fault)},
    )
    srv.wait_ready()
    return srv


def completion(url: str, prompt: list[int], **kw) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json={**body, **kw}, timeout=60)


@pytest.mark.slow  # starts a server of its own
def test_an_injected_exception_fails_only_its_step_and_the_server_serves_on(
    tiny_model_dir, tmp_path
):
    fault = tmp_path / "fault"
    # Async scheduling keeps a step in flight: the hardest state to recover from.
    srv = start_server(tiny_model_dir, fault, "--max-num-seqs", "1", "--async-scheduling")
    try:
        prompt = [5, 17, 99, 3, 42]
        reference = completion(srv.url, prompt).json()["choices"][0]

        # A stream mid-generation: the next step fails; it ends with an error event.
        events: list[str] = []
        streaming = threading.Event()

        def stream() -> None:
            body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        events.append(line)
                        streaming.set()

        t = threading.Thread(target=stream)
        t.start()
        assert streaming.wait(30)
        arm(fault, "raise")
        t.join(30)
        assert not t.is_alive()
        assert events[-1] == "data: [DONE]"
        err = json.loads(events[-2].removeprefix("data: "))["error"]
        assert "step" in err["message"] and "InjectedFault" in err["message"]
        assert httpx.get(srv.url + "/health").status_code == 200

        # Non-streamed: with one sequence at a time, the failed step holds one request;
        # the one queued behind it is served, with the reference tokens.
        arm(fault, "raise")
        results: list[httpx.Response] = [None, None]  # type: ignore[list-item]

        def send(i: int) -> None:
            results[i] = completion(srv.url, prompt)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 500], [r.text for r in results]
        failed = next(r for r in results if r.status_code == 500).json()["error"]
        assert failed["message"] and failed["type"]
        ok = next(r for r in results if r.status_code == 200).json()["choices"][0]
        assert ok["text"] == reference["text"]

        assert httpx.get(srv.url + "/health").status_code == 200
        assert completion(srv.url, prompt).json()["choices"][0]["text"] == reference["text"]
        assert srv.proc.poll() is None
    finally:
        srv.stop()


@pytest.mark.slow  # starts a server of its own
def test_repeated_step_failures_end_the_engine_and_the_server_exits_non_zero(
    tiny_model_dir, tmp_path
):
    fault = tmp_path / "fault"
    srv = start_server(tiny_model_dir, fault, "--max-num-seqs", "1")
    try:
        engine = srv.engine_pid()
        arm(fault, f"raise {MAX_CONSECUTIVE_STEP_FAILURES}")
        # One sequence at a time: each failed step ends one request, the next one runs.
        results: list[httpx.Response | Exception] = []

        def send() -> None:
            try:
                results.append(completion(srv.url, [1, 2, 3]))
            except httpx.HTTPError as e:
                results.append(e)

        threads = [threading.Thread(target=send) for _ in range(MAX_CONSECUTIVE_STEP_FAILURES)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        codes = [r.status_code if isinstance(r, httpx.Response) else None for r in results]
        assert all(c in (500, 503, None) for c in codes), codes
        assert codes.count(500) >= MAX_CONSECUTIVE_STEP_FAILURES - 1, codes
        assert wait_gone(engine, 10), "the engine exited"
        code = wait_exit(srv, 15)
        assert code not in (None, 0), "the server exits non-zero, for a supervisor to restart"
    finally:
        srv.stop()


@pytest.mark.slow  # starts a server of its own
def test_a_wedged_step_is_declared_dead_after_the_stall_timeout(tiny_model_dir, tmp_path):
    fault = tmp_path / "fault"
    srv = start_server(tiny_model_dir, fault, "--engine-stall-timeout", "2")
    try:
        engine = srv.engine_pid()
        arm(fault, "hang 60")
        t0 = time.monotonic()
        r = completion(srv.url, [1, 2, 3])
        waited = time.monotonic() - t0
        assert r.status_code == 503 and "stall" in r.json()["error"]["message"]
        assert 2 <= waited < 10
        assert wait_gone(engine, 5), "the wedged engine was killed"
        code = wait_exit(srv, 15)
        assert code not in (None, 0)
    finally:
        srv.stop()


def test_a_finished_request_whose_reader_is_slow_is_no_stall(tiny_model_dir):
    """The stall clock runs only while the engine owes tokens: a finished request whose
    handler is still busy writing to a slow client must not get a healthy engine killed."""
    from cadence.engine.client import AsyncEngineClient

    async def scenario() -> bool:
        config = EngineConfig.from_kwargs(
            model=tiny_model_dir("llama"),
            num_gpu_blocks_override=64,
            max_model_len=512,
            cpu_threads=worker_threads(),  # the worker's share of the cores, as served
        )
        client = AsyncEngineClient(config, None, stall_timeout=0.5)
        await client.start()
        try:
            gen = client.generate("slow-reader", None, [1, 2, 3], greedy())
            async for state in gen:
                if state.finished:
                    break  # hold the generator, as a handler blocked on a slow socket does
            await asyncio.sleep(2.0)  # four stall timeouts, the engine idle and silent
            healthy = client.healthy
            await gen.aclose()
            return healthy
        finally:
            await client.shutdown()

    assert asyncio.run(scenario()), "the engine was declared dead while it owed nothing"
