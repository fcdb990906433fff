"""The engine process never outlives or hangs its server (issue 14, point 4).

SIGKILL the API process mid-generation and the engine is gone within seconds, whether the
engine was spawned from the main thread (the kernel's parent-death signal) or from another
one (the loop's own check of its parent, and the parent's sentinel pipe while idle). A busy
engine that has nothing to report still sends a heartbeat every second; a send the server
does not take within the timeout ends the engine instead of blocking it forever.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import zmq
from engine_helpers import process_alive, wait_gone
from server_helper import Server, worker_threads

from cadence.config import EngineConfig
from cadence.core.scheduler_output import SchedulerStats
from cadence.engine import protocol as P
from cadence.engine.core_proc import EngineExit, EngineLoop, make_outbox, send_or_exit
from cadence.engine.fanout import OutputFanout
from cadence.engine.step_timeline import StepTimeline
from cadence.structured.manager import GrammarStats

GONE_WITHIN = 5.0  # seconds from the API process's death to the engine's
# 8 samples of 500 tokens, one at a time: 4000 steps of work, so an engine that checks on
# its parent only when idle would outlive the bound by far (and overflow its send queue
# towards the dead server).
WORK = {"prompt": [1, 2, 3], "max_tokens": 500, "n": 8, "ignore_eos": True}
ENGINE_ARGS = ["--num-gpu-blocks-override", "256", "--max-model-len", "512", "--max-num-seqs", "1"]


@pytest.mark.slow  # starts a server of its own
def test_sigkilling_the_api_server_mid_stream_takes_the_engine_with_it(tiny_model_dir):
    srv = Server([tiny_model_dir("llama"), *ENGINE_ARGS])
    engine = None
    try:
        srv.wait_ready()
        engine = srv.engine_pid()
        streaming = threading.Event()

        def stream() -> None:
            body = {**WORK, "stream": True}
            try:
                with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
                    for line in r.iter_lines():
                        if line:
                            streaming.set()
            except httpx.HTTPError:
                pass  # the server is killed under it

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert streaming.wait(30)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(5)
        assert wait_gone(engine, GONE_WITHIN), "the engine outlived its server"
        t.join(10)
    finally:
        srv.stop()
        if engine is not None and process_alive(engine):
            os.kill(engine, signal.SIGKILL)  # a failed test leaves nothing behind


# A server stand-in that starts its engine client from a thread that is not the main one:
# no parent-death signal then, the engine must notice by itself. Its engine takes the test
# worker's share of the cores, as a served one does (tests/server_helper.py): by default it
# would pin a thread to every core, and beside the other test workers its steps (start-up
# included) would crawl.
CLIENT_IN_A_THREAD = r"""
import asyncio, sys, threading
from cadence.config import EngineConfig
from cadence.engine.client import AsyncEngineClient
from cadence.sampling_params import SamplingParams

async def serve(busy):
    config = EngineConfig.from_kwargs(
        model=sys.argv[1], num_gpu_blocks_override=256, max_model_len=512, max_num_seqs=1,
        cpu_threads=int(sys.argv[3]),
    )
    client = AsyncEngineClient(config, None)
    await client.start()
    print("engine", client.engine_pid, flush=True)
    if not busy:
        print("idle", flush=True)
        await asyncio.sleep(3600)
    params = SamplingParams(max_tokens=500, n=8, ignore_eos=True)
    async for _ in client.generate("r", None, [1, 2, 3], params):
        print("busy", flush=True)
        await asyncio.sleep(3600)

if __name__ == "__main__":  # the engine is spawned: it imports this file again
    t = threading.Thread(target=asyncio.run, args=(serve(sys.argv[2] == "busy"),))
    t.start()
    t.join()
"""


@pytest.mark.parametrize("state", ["busy", "idle"])
@pytest.mark.slow  # starts a server of its own
def test_an_engine_spawned_off_the_main_thread_still_dies_with_its_server(
    tiny_model_dir, tmp_path, state
):
    script = tmp_path / "server.py"
    script.write_text(CLIENT_IN_A_THREAD)
    proc = subprocess.Popen(
        [sys.executable, str(script), tiny_model_dir("llama"), state, str(worker_threads())],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(x.strip()) for x in proc.stdout], daemon=True
    ).start()
    engine = None
    try:
        deadline = time.monotonic() + 120
        line = ""
        while line != state:
            assert proc.poll() is None and time.monotonic() < deadline, "the stand-in failed"
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=0.5)
            if line.startswith("engine"):
                engine = int(line.split()[1])
        assert engine is not None and process_alive(engine)
        proc.kill()
        proc.wait(5)
        assert wait_gone(engine, GONE_WITHIN), f"the {state} engine outlived its server"
    finally:
        proc.kill()
        if engine is not None and process_alive(engine):
            os.kill(engine, signal.SIGKILL)


class SilentCore:
    """A core with work that produces nothing (its one request awaits a grammar, say)."""

    class grammars:
        stats = GrammarStats()

    class runner:
        num_blocks = 16
        image_totals = None  # a text model

    config = EngineConfig()
    timeline = StepTimeline(0)

    def has_unfinished_requests(self) -> bool:
        return True

    def step(self) -> list:
        time.sleep(0.01)
        return []

    def take_failed(self) -> list:
        return []

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_waiting=1)


def test_a_busy_engine_with_nothing_to_report_still_sends_a_heartbeat(tmp_path):
    ctx = zmq.Context()
    addr_in, addr_out = f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out"
    to_core, from_core = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    to_core.bind(addr_in)
    from_core.bind(addr_out)
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(addr_in)
    outbox = make_outbox(ctx, addr_out)
    # In this process the loop's "parent" is the test runner's parent.
    loop = EngineLoop(SilentCore(), inbox, OutputFanout([outbox]), os.getppid())
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(loop.run()))
    t.start()
    try:
        window = 3.5 * P.HEARTBEAT_INTERVAL_S
        beats = []
        deadline = time.monotonic() + window
        while (left := deadline - time.monotonic()) > 0:
            if from_core.poll(int(left * 1000)):
                beats.append(P.outputs_decoder.decode(from_core.recv()))
        assert 3 <= len(beats) <= 5, "about one a second: a heartbeat, not a flood"
        assert all(b.stats.num_waiting == 1 and not b.updates for b in beats)
    finally:
        to_core.send_multipart([P.SHUTDOWN, b""])
        t.join(5)
        for s in (to_core, from_core, inbox, outbox):
            s.close(linger=0)
        ctx.term()
    assert codes == [0], "SHUTDOWN ends the loop cleanly"


def test_a_send_the_server_never_takes_ends_the_engine_instead_of_blocking(tmp_path):
    ctx = zmq.Context()
    addr = f"ipc://{tmp_path}/out"
    server = ctx.socket(zmq.PULL)  # alive, but never reads (a frozen API process)
    server.setsockopt(zmq.RCVHWM, 1)
    server.bind(addr)
    outbox = make_outbox(ctx, addr, timeout_s=0.2)
    frame = b"x" * 1024
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineExit) as exc:
            for _ in range(1_000_000):  # the queue and buffers fill, then a send times out
                send_or_exit(OutputFanout([outbox]).broadcast, frame)
        assert exc.value.code == 1
        assert time.monotonic() - t0 < 30
    finally:
        outbox.close(linger=0)
        server.close(linger=0)
        ctx.term()
