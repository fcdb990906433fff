"""The API server's handle on the engine core process.

    client = AsyncEngineClient(config, tokenizer, observer)
    await client.start()                    spawn the core, wait for EngineReady
    async for state in client.generate(...):   RequestState snapshots as tokens arrive
    await client.abort(request_id)          a hang-up
    await client.shutdown()

One background task reads the core's output socket and feeds the OutputProcessor (which
detokenizes and checks stop strings here, off the core); another watches the core process
and, if it dies, fails every in-flight request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from cadence.config import EngineConfig
from cadence.engine import protocol as P
from cadence.engine.core_proc import run_engine_core
from cadence.engine.output_processor import (
    OutputProcessor,
    RequestObserver,
    RequestState,
    sample_params,
)
from cadence.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    pass


class _Stream:
    """Wakes one request's handler when its state changed or an error arrived."""

    __slots__ = ("event", "error", "state")

    def __init__(self, state: RequestState) -> None:
        self.event = asyncio.Event()
        self.error: Exception | None = None
        self.state = state


class AsyncEngineClient:
    def __init__(
        self, config: EngineConfig, tokenizer, observer: RequestObserver | None = None
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.output_processor = OutputProcessor(tokenizer, observer)
        self.streams: dict[str, _Stream] = {}
        self.ready: P.EngineReady | None = None
        self.stats = P.EngineStats()
        self.on_stats = None  # callback(EngineStats)
        self.dead_reason: str | None = None
        self._tasks: list[asyncio.Task] = []
        self._proc: mp.process.BaseProcess | None = None

    # ---- life cycle -------------------------------------------------------------------

    async def start(self, startup_timeout: float = 600.0) -> P.EngineReady:
        self._dir = tempfile.mkdtemp(prefix="cadence-")
        in_addr = f"ipc://{self._dir}/in"
        out_addr = f"ipc://{self._dir}/out"
        self.ctx = zmq.asyncio.Context()
        self.to_core = self.ctx.socket(zmq.PUSH)
        self.to_core.bind(in_addr)
        self.from_core = self.ctx.socket(zmq.PULL)
        self.from_core.bind(out_addr)
        spawn = mp.get_context("spawn")
        self._proc = spawn.Process(
            target=run_engine_core,
            args=(self.config, in_addr, out_addr, logging.getLogger().getEffectiveLevel()),
            name="cadence::engine",
            daemon=True,
        )
        self._proc.start()
        deadline = time.monotonic() + startup_timeout
        while True:
            if not self._proc.is_alive():
                raise RuntimeError(
                    f"engine process exited during start-up (code {self._proc.exitcode})"
                )
            if time.monotonic() > deadline:
                raise TimeoutError("engine did not start in time")
            if await self.from_core.poll(500):
                msg = P.outputs_decoder.decode(await self.from_core.recv())
                if isinstance(msg, P.EngineReady):
                    self.ready = msg
                    break
                if msg.errors:
                    raise RuntimeError(msg.errors[0][1])
        self._tasks = [
            asyncio.create_task(self._output_loop(), name="cadence-outputs"),
            asyncio.create_task(self._watchdog(), name="cadence-watchdog"),
        ]
        return self.ready

    async def shutdown(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(zmq.ZMQError):
                await self.to_core.send_multipart([P.SHUTDOWN, b""])
            await asyncio.to_thread(self._proc.join, 10)
            if self._proc.is_alive():
                self._proc.terminate()
                await asyncio.to_thread(self._proc.join, 5)
            if self._proc.is_alive():
                self._proc.kill()
        self.to_core.close(linger=0)
        self.from_core.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)  # the two ipc socket files

    @property
    def engine_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and self._proc is not None and self._proc.is_alive()

    # ---- requests ---------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestState]:
        """Yield the request's state each time it changes, until every sample finished.

        If the caller stops early (a hang-up cancels it), the request is aborted in the core.
        """
        if not self.healthy:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        now = time.time()
        ids = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params, now)
        stream = _Stream(self.output_processor.requests[request_id])
        self.streams[request_id] = stream
        for sid in ids:
            self.streams[sid] = stream
        finished = False
        try:
            for sid, child in zip(ids, sample_params(params)):
                req = P.EngineCoreRequest(sid, prompt_token_ids, child, now, priority)
                await self.to_core.send_multipart([P.ADD, P.encoder.encode(req)])
            while True:
                await stream.event.wait()
                stream.event.clear()
                if stream.error is not None:
                    raise stream.error
                finished = stream.state.finished
                yield stream.state
                if finished:
                    return
        finally:
            for sid in ids:
                self.streams.pop(sid, None)
            self.streams.pop(request_id, None)
            if not finished:
                await self._abort_in_core(self.output_processor.abort(request_id))

    async def abort(self, request_id: str) -> None:
        await self._abort_in_core(self.output_processor.abort(request_id))

    async def _abort_in_core(self, sample_ids: list[str]) -> None:
        if sample_ids and self.healthy:
            with contextlib.suppress(zmq.ZMQError):
                await self.to_core.send_multipart([P.ABORT, P.encoder.encode(sample_ids)])

    # ---- background tasks -------------------------------------------------------------

    async def _output_loop(self) -> None:
        while True:
            raw = await self.from_core.recv()
            try:
                msg = P.outputs_decoder.decode(raw)
                self._handle(msg)
            except Exception:  # one bad message must not kill every request
                logger.exception("failed to handle engine output")

    def _handle(self, msg: P.EngineCoreOutputs) -> None:
        if msg.stats is not None:
            self.stats = msg.stats
            if self.on_stats is not None:
                self.on_stats(msg.stats)
        for rid, message in msg.errors:
            stream = self.streams.get(rid)
            if stream is not None:
                stream.error = ValueError(message)
                stream.event.set()
        if not msg.updates:
            return
        changed, to_stop = self.output_processor.process(msg.updates)
        if to_stop:
            asyncio.create_task(self._abort_in_core(to_stop))
        for state in changed:
            stream = self.streams.get(state.request_id)
            if stream is not None:
                stream.event.set()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            if self._proc is not None and not self._proc.is_alive():
                self.dead_reason = f"the engine core process died (exit code {self._proc.exitcode})"
                logger.error(self.dead_reason)
                for stream in list(self.streams.values()):
                    stream.error = EngineDeadError(self.dead_reason)
                    stream.event.set()
                return
