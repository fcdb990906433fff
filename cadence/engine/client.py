"""The API server's handle on the engine core process.

    client = AsyncEngineClient(config, tokenizer, observer)
    await client.start()                    spawn the core (or attach to the one the
                                            supervisor started), wait for EngineReady
    async for state in client.generate(...):   RequestState snapshots as tokens arrive
    await client.abort(request_id)          a hang-up
    await client.shutdown()

With several API processes (--api-server-count, entrypoints/api_servers.py) the supervisor
starts the core and each API process attaches to it (EngineAttachment): its own pair of
sockets, its requests marked with its index so their outputs come back to it. Such a client
never stops the core; it watches the core by pid and still declares it dead or wedged.

One background task reads the core's output socket and feeds the OutputProcessor (which
detokenizes and checks stop strings here, off the core); another watches the core process.

How a request can fail:
  ValueError        the core refused it (a bad grammar, a prompt too long): HTTP 400
  EngineStepError   the engine step computing it raised; the engine ended it and keeps
                    serving the others: HTTP 500 (see cadence.engine.core_proc)
  EngineDeadError   the engine is dead: its process exited, or it was declared wedged
                    (requests in flight and not one message for `stall_timeout` seconds,
                    although a working engine sends one at least every second) and killed.
                    Every in-flight request fails at once, `healthy` turns False and
                    `dead_event` is set: the server is expected to exit non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass

import zmq
import zmq.asyncio

from cadence.allocator import Trimmer
from cadence.config import EngineConfig
from cadence.engine import protocol as P
from cadence.engine.core_proc import run_engine_core
from cadence.engine.output_processor import (
    OutputProcessor,
    RequestObserver,
    RequestState,
    sample_params,
)
from cadence.lora_request import LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.private_dirs import make_private_dir
from cadence.process import ProcessByPid
from cadence.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Called, in the caller's context, once generate() has sent a request's every sample to the
# engine core: the API server's intake gate lets the next request in (entrypoints/intake.py).
request_submitted: ContextVar[Callable[[], None] | None] = ContextVar(
    "request_submitted", default=None
)


# A first step that compiles Triton kernels, or a long prefill on a CPU, can keep a healthy
# engine silent for minutes; a wedged one stays silent forever. Five minutes trips on the
# second and not the first.
DEFAULT_STALL_TIMEOUT_S = 300.0
WATCHDOG_INTERVAL_S = 0.2


class EngineDeadError(RuntimeError):
    """The engine process is gone (or was killed as wedged): nothing will be served."""


class EngineStepError(RuntimeError):
    """The engine step computing this request failed; the engine ended the request and
    serves the others."""


class EngineCallError(RuntimeError):
    """The core could not answer a call (its reason is the message)."""


@dataclass(frozen=True)
class EngineAttachment:
    """An API process's place beside an engine core it did not start."""

    client_index: int  # this process's index: the core sends its requests' outputs there
    in_addr: str  # ipc:// this process binds, the core reads requests from
    out_addr: str  # ipc:// this process binds, the core sends this process's outputs to
    engine_pid: int


class _Stream:
    """Wakes one request's handler when its state changed or an error arrived."""

    __slots__ = ("event", "error", "state")

    def __init__(self, state: RequestState) -> None:
        self.event = asyncio.Event()
        self.error: Exception | None = None
        self.state = state


class AsyncEngineClient:
    def __init__(
        self,
        config: EngineConfig,
        tokenizer,
        observer: RequestObserver | None = None,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_S,
        attach: EngineAttachment | None = None,
    ) -> None:
        """`stall_timeout`: seconds of silence from the engine, with requests in flight,
        after which it is declared wedged, killed, and every request fails. `attach`: the
        core another process started (None: start one)."""
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout}")
        self.config = config
        self.stall_timeout = stall_timeout
        self.attach = attach
        self.client_index = attach.client_index if attach else 0
        self.tokenizer = tokenizer
        self.output_processor = OutputProcessor(tokenizer, observer)
        self.streams: dict[str, _Stream] = {}
        self.ready: P.EngineReady | None = None
        self.stats = P.EngineStats()
        self.on_stats = None  # callback(EngineStats)
        self.dead_reason: str | None = None
        self.dead_event = asyncio.Event()  # set once, when the engine is declared dead
        self._last_heard = time.monotonic()  # the engine's last message (or first request)
        self._tasks: list[asyncio.Task] = []
        self._proc: mp.process.BaseProcess | ProcessByPid | None = None
        self._trimmer = Trimmer()  # this process's free heap back to the OS after bursts
        self._calls: dict[int, asyncio.Future] = {}  # call id -> its reply, to come
        self._next_call_id = 0

    # ---- life cycle -------------------------------------------------------------------

    async def start(self, startup_timeout: float = 600.0) -> P.EngineReady:
        if self.attach is not None:
            self._dir = None  # (the supervisor's, removed by it)
            self._bind(self.attach.in_addr, self.attach.out_addr)
            self._proc = ProcessByPid(self.attach.engine_pid)
        else:
            self._dir = make_private_dir("cadence-")  # 0700: this user's sockets only
            self._bind(f"ipc://{self._dir}/in", f"ipc://{self._dir}/out")
            self._proc = self._spawn_core()
        try:
            self.ready = await self._wait_ready(startup_timeout)
        except BaseException:
            if self.attach is None:
                self._proc.kill()
            raise
        self._tasks = [
            asyncio.create_task(self._output_loop(), name="cadence-outputs"),
            asyncio.create_task(self._watchdog(), name="cadence-watchdog"),
        ]
        return self.ready

    def _bind(self, in_addr: str, out_addr: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.to_core = self.ctx.socket(zmq.PUSH)
        self.to_core.bind(in_addr)
        self.from_core = self.ctx.socket(zmq.PULL)
        self.from_core.bind(out_addr)
        self._addrs = (in_addr, out_addr)

    def _spawn_core(self) -> mp.process.BaseProcess:
        spawn = mp.get_context("spawn")
        # The kernel's parent-death signal fires when the spawning *thread* ends: ask for it
        # only from the main thread, which lives as long as this process.
        pdeathsig = threading.current_thread() is threading.main_thread()
        level = logging.getLogger().getEffectiveLevel()
        in_addr, out_addr = self._addrs
        proc = spawn.Process(
            target=run_engine_core,
            args=(self.config, [in_addr], [out_addr], level, os.getpid(), pdeathsig),
            name="cadence::engine",
            daemon=True,
        )
        proc.start()
        return proc

    async def _wait_ready(self, timeout: float) -> P.EngineReady:
        deadline = time.monotonic() + timeout
        while True:
            # Messages first: a core that failed to start sends why, then exits.
            if await self.from_core.poll(500):
                msg = P.outputs_decoder.decode(await self.from_core.recv())
                if isinstance(msg, P.EngineReady):
                    return msg
                if msg.errors:
                    raise RuntimeError(msg.errors[0][1])
                continue
            if not self._proc.is_alive():
                raise RuntimeError(
                    f"engine process exited during start-up (code {self._proc.exitcode})"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not start in {timeout:g} s")

    async def shutdown(self) -> None:
        """Stop the core in order (this is not a death: dead_event stays clear). An
        attached client only closes its sockets: the supervisor stops the core."""
        for t in self._tasks:
            t.cancel()
        if self.attach is None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(zmq.ZMQError, TimeoutError):
                await asyncio.wait_for(self.to_core.send_multipart([P.SHUTDOWN, b""]), 1.0)
            await asyncio.to_thread(self._proc.join, 10)
            if self._proc.is_alive():
                self._proc.terminate()
                await asyncio.to_thread(self._proc.join, 5)
            if self._proc.is_alive():
                self._proc.kill()
        self.to_core.close(linger=0)
        self.from_core.close(linger=0)
        self.ctx.term()
        if self._dir is not None:
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
        lora: LoRARequest | None = None,
        images: list[ImageInput] | None = None,
    ) -> AsyncIterator[RequestState]:
        """Yield the request's state each time it changes, until every sample finished.
        `lora`: the adapter it runs with (None: the base model); `images`: those behind
        its image placeholder tokens.

        If the caller stops early (a hang-up cancels it), the request is aborted in the core.
        """
        if not self.healthy:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        if not self.output_processor.requests:  # the stall clock starts with the first
            self._last_heard = time.monotonic()  # request the engine owes tokens to
        now = time.time()
        ids = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params, now)
        stream = _Stream(self.output_processor.requests[request_id])
        self.streams[request_id] = stream
        for sid in ids:
            self.streams[sid] = stream
        finished = False
        try:
            for sid, child in zip(ids, sample_params(params)):
                req = P.EngineCoreRequest(
                    sid,
                    prompt_token_ids,
                    child,
                    now,
                    priority,
                    lora,
                    self.client_index,
                    images or [],
                )
                await self._send_to_core([P.ADD, P.encoder.encode(req)])
            if (submitted := request_submitted.get()) is not None:
                submitted()
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

    async def abort_all(self) -> None:
        """End every request in flight with finish_reason "abort" (its handler still sends
        the last chunk or the JSON) and drop them in the core: a drain that ran out of time."""
        for rid in list(self.output_processor.requests):
            sample_ids = self.output_processor.abort(rid)
            stream = self.streams.get(rid)
            if stream is not None:
                stream.event.set()
            await self._abort_in_core(sample_ids)

    async def call(self, method: str, timeout: float = 10.0, **args) -> object:
        """Ask the core a question (cadence.engine.introspect) and wait for its answer,
        given between two steps. Raises EngineCallError with the core's reason, or
        EngineDeadError / TimeoutError."""
        if not self.healthy:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        self._next_call_id += 1
        call_id = self._next_call_id
        reply = asyncio.get_running_loop().create_future()
        self._calls[call_id] = reply
        try:
            await self._send_to_core(
                [P.CALL, P.encoder.encode(P.EngineCall(call_id, method, args, self.client_index))]
            )
            return await asyncio.wait_for(reply, timeout)
        finally:
            self._calls.pop(call_id, None)

    async def _abort_in_core(self, sample_ids: list[str]) -> None:
        if sample_ids and self.healthy:
            with contextlib.suppress(zmq.ZMQError, EngineDeadError):
                await self._send_to_core([P.ABORT, P.encoder.encode(sample_ids)])

    async def _send_to_core(self, frames: list[bytes]) -> None:
        """Send to the core; if its queue is full (a wedged core reads nothing), wait only
        until the core is declared dead, then raise EngineDeadError."""
        sent = self.to_core.send_multipart(frames)
        if not sent.done():
            dead = asyncio.ensure_future(self.dead_event.wait())
            try:
                await asyncio.wait({sent, dead}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                dead.cancel()
            if not sent.done():
                sent.cancel()
                raise EngineDeadError(self.dead_reason or "the engine is not running")
        sent.result()

    # ---- background tasks -------------------------------------------------------------

    async def _output_loop(self) -> None:
        while True:
            raw = await self.from_core.recv()
            self._last_heard = time.monotonic()  # any message is a heartbeat
            try:
                msg = P.outputs_decoder.decode(raw)
                self._handle(msg)
            except Exception:  # one bad message must not kill every request
                logger.exception("failed to handle engine output")

    def _fail(self, request_id: str, error: Exception) -> None:
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.error = error
            stream.event.set()

    def _handle(self, msg: P.EngineCoreOutputs | P.EngineCallReply) -> None:
        if isinstance(msg, P.EngineCallReply):
            reply = self._calls.get(msg.call_id)
            if reply is not None and not reply.done():
                if msg.error is not None:
                    reply.set_exception(EngineCallError(msg.error))
                else:
                    reply.set_result(msg.result)
            return
        self._trimmer.worked()
        if msg.stats is not None:
            self.stats = msg.stats
            if self.on_stats is not None:
                self.on_stats(msg.stats)
        for rid, message in msg.errors:
            self._fail(rid, ValueError(message))
        for rid, message in msg.step_errors:
            self._fail(rid, EngineStepError(message))
        if not msg.updates:
            return
        changed, to_stop = self.output_processor.process(msg.updates)
        # Updates the output processor could not apply (it applies the rest of the
        # message): their requests end with an error; the core is told by generate().
        for rid, message in self.output_processor.take_failed():
            self._fail(rid, EngineStepError(message))
        if to_stop:
            asyncio.create_task(self._abort_in_core(to_stop))
        for state in changed:
            stream = self.streams.get(state.request_id)
            if stream is not None:
                stream.event.set()

    async def _watchdog(self) -> None:
        """Declare the engine dead when its process exits, or when it is wedged: unfinished
        requests and not one message (updates or heartbeat) for `stall_timeout` s."""
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            self._trimmer.tick()
            if self._proc is None:
                continue
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._declare_dead(
                    "the engine core process died"
                    + (f" (exit code {code})" if code is not None else "")
                )
                return
            silent = time.monotonic() - self._last_heard
            # Unfinished requests only: a finished one whose handler is still writing to a
            # slow client owes the engine nothing (and an idle engine sends no heartbeat).
            if self.output_processor.requests and silent > self.stall_timeout:
                self._declare_dead(
                    f"the engine core made no progress for {silent:.0f} s with requests in "
                    f"flight (stall timeout {self.stall_timeout:g} s); it was killed"
                )
                self._proc.kill()
                await asyncio.to_thread(self._proc.join, 10)
                return

    def _declare_dead(self, reason: str) -> None:
        """Fail every in-flight request at once; /health turns 503 from here on."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        logger.error(reason)
        for stream in set(self.streams.values()):
            stream.error = EngineDeadError(reason)
            stream.event.set()
        for reply in self._calls.values():
            if not reply.done():
                reply.set_exception(EngineDeadError(reason))
        self.dead_event.set()
