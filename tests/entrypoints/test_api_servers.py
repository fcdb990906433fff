"""Several API processes in front of one engine: `cadence serve --api-server-count 2`.

Greedy output equals transformers' whichever process answers; /metrics and the engine view
count every process's requests once; the admission bounds hold for the whole server; the
engine's introspection answers the process that asked; SIGTERM drains every process and the
server exits 0; a killed API process ends the server with exit code 1."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import sys
import time

import httpx
import pytest
import torch
from model_helpers import hf_greedy
from server_helper import Server, children, metric

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "executor"))
from tp_helpers import save_tiny_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

PROMPTS = [[1, 504, 6071, 42, 9, 333, 17], [5, 88, 901], [77] * 12, [3, 4, 5, 6, 7, 8]]


def args(base: str, *more: str) -> list[str]:
    return [
        "--model", base, "--dtype", "float32", "--api-server-count", "2",
        "--kv-cache-memory", str(64 * 2**20), "--served-model-name", "tiny", *more,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return save_tiny_with_tokenizer(str(tmp_path_factory.mktemp("api-servers") / "tiny"))


@pytest.fixture(scope="module")
def srv(base):
    server = Server(args(base, "--max-num-seqs", "4", "--max-num-waiting", "0"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def complete(url: str, prompt, max_tokens: int = 8) -> dict:
    # A client of its own each: a new connection, which either process may accept.
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_server_runs_one_engine_and_two_api_processes(srv):
    names = sorted(c for _, cmd in children(srv.proc.pid) if (c := cmd.split(b"\0")[0]))
    names = [n for n in names if n.startswith(b"cadence::")]  # (not multiprocessing's helper)
    assert names == [b"cadence::api0", b"cadence::api1", b"cadence::engine"]


def test_greedy_output_equals_transformers_whichever_process_answers(srv, base):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.inference_mode():
        want = [hf_greedy(model, p, 8) for p in PROMPTS]
    detok = [httpx.post(srv.url + "/detokenize", json={"tokens": w}).json()["prompt"] for w in want]
    with cf.ThreadPoolExecutor(4) as pool:  # (--max-num-seqs 4, no waiting room)
        got = list(pool.map(lambda p: complete(srv.url, p)["choices"][0]["text"], PROMPTS * 2))
    assert got == detok * 2


def test_metrics_and_the_engine_view_count_every_process_once(srv):
    http = httpx.Client(base_url=srv.url)
    before = {
        name: metric(http, name)
        for name in (
            "cadence:request_success_total",
            "cadence:generation_tokens_total",
            "cadence:prompt_tokens_total",
            "cadence:prefix_cache_queries_total",
        )
    }
    finished = http.get("/v1/engine/stats").json()["requests"]["finished"]
    with cf.ThreadPoolExecutor(4) as pool:  # (--max-num-seqs 4, no waiting room)
        list(pool.map(lambda p: complete(srv.url, p, 5), PROMPTS * 3))
    prompt_tokens = 3 * sum(len(p) for p in PROMPTS)
    assert (
        metric(http, "cadence:request_success_total") - before["cadence:request_success_total"]
        == 12
    )
    assert (
        metric(http, "cadence:generation_tokens_total") - before["cadence:generation_tokens_total"]
        == 12 * 5
    )
    assert (
        metric(http, "cadence:prompt_tokens_total") - before["cadence:prompt_tokens_total"]
        == prompt_tokens
    )
    # The engine's counters are recorded once, not once per API process.
    assert (
        metric(http, "cadence:prefix_cache_queries_total")
        - before["cadence:prefix_cache_queries_total"]
        == prompt_tokens
    )
    stats = http.get("/v1/engine/stats").json()
    assert stats["requests"]["finished"] - finished == 12
    steps = http.get("/v1/engine/steps", params={"limit": 4}).json()
    assert steps["num_steps"] == stats["num_steps"] and len(steps["steps"]) == 4


def test_admission_holds_for_the_whole_server(srv):
    """--max-num-seqs 4, --max-num-waiting 0: while one request holds 4 sequences, every
    other is refused, whichever process takes it."""
    body = {"prompt": PROMPTS[0], "max_tokens": 100_000, "n": 4, "stream": True,
            "ignore_eos": True, "temperature": 1.0}  # fmt: skip
    with (
        httpx.Client(timeout=60) as holder,
        holder.stream(
            "POST", srv.url + "/v1/completions", json={**body, "max_tokens": 400}
        ) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # running
        with cf.ThreadPoolExecutor(6) as pool:
            codes = list(
                pool.map(
                    lambda _: (
                        httpx.post(
                            srv.url + "/v1/completions",
                            json={"prompt": [1, 2], "max_tokens": 2},
                            timeout=60,
                        ).status_code
                    ),
                    range(6),
                )
            )
        assert codes == [429] * 6
        in_flight = httpx.get(srv.url + "/v1/engine/stats").json()["requests"]["in_flight"]
        assert in_flight == 4


def test_sigterm_drains_every_api_process_and_exits_0(base):
    server = Server(args(base))
    server.wait_ready()

    def stream() -> list[str]:
        body = {"prompt": PROMPTS[1], "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            started.append(first)
            return [first, *(line for line in lines if line.startswith("data: "))]

    started: list[str] = []
    with cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(stream) for _ in range(6)]
        deadline = time.monotonic() + 60
        while len(started) < 6 and time.monotonic() < deadline:  # all admitted, then the signal
            time.sleep(0.005)
        server.proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    assert server.proc.wait(60) == 0
    for events in results:
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][len("data: ") :])
        assert last["choices"][0]["finish_reason"] == "length", "finished, not cut off"
    assert not [c for _, c in children(server.proc.pid) if c.startswith(b"cadence::")]


def test_a_killed_api_process_ends_the_server_with_exit_code_1(base):
    server = Server(args(base))
    try:
        server.wait_ready()
        pid = next(p for p, cmd in children(server.proc.pid) if cmd.startswith(b"cadence::api1"))
        os.kill(pid, signal.SIGKILL)
        assert server.proc.wait(60) == 1
    finally:
        server.stop()
