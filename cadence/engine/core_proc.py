"""The engine core in its own process: the busy loop behind two ZMQ sockets.

    loop:
        parent still there?                      else exit
        drain the inbox (block only when there is no work): add / abort / shutdown
        updates = core.step()                    a failure ends only its step's requests
        send EngineCoreOutputs(updates, errors, step_errors, stats)

The API server's process starts this one (spawn), reads one EngineReady, then streams.

Never outliving the server. The engine must not keep a GPU busy for a server that is gone:
  - PR_SET_PDEATHSIG (Linux): the kernel sends SIGKILL when the parent dies, even mid-step.
    It fires on the death of the *thread* that started us, so the client asks for it only
    when it spawns from its main thread; after setting it, getppid() is checked once more
    (the parent may have died before we got here).
  - Otherwise, and as a fallback: the parent's pid is compared with getppid() every loop
    iteration (one cheap syscall), and an idle engine's poll also watches multiprocessing's
    parent sentinel, a pipe that reads EOF the moment the parent is gone.
  - A send never blocks forever: SNDTIMEO bounds it (SEND_TIMEOUT_S); a server that reads
    nothing for that long is gone or wedged, and the engine logs it and exits.

Step failures (the policy). When `EngineCore.step()` raises:
  - the traceback is logged; `EngineCore.fail_step()` ends the failed step's requests (those
    in the running batch, the step in flight, and any whose token was in flight), frees
    their KV blocks, forgets the prefix cache and has the runner drop their rows;
  - each of those requests gets a step error (the API answers 500 with an error object, or
    an SSE error event and [DONE] on a stream); queued requests stay and run normally;
  - after MAX_CONSECUTIVE_STEP_FAILURES failed steps with no successful one in between,
    the engine exits with code 1 (the server then exits non-zero, for a supervisor to
    restart it): a fault that repeats is not one a retry will fix (a dead GPU context, say).
  - Liveness: while it has unfinished work the loop sends a message at least every
    HEARTBEAT_INTERVAL_S (stats only, if nothing else), including while a request waits for
    its grammar. The client declares a silent engine wedged after its stall timeout.

The test-only fault hook (cadence.engine.faults, CADENCE_FAULT_FILE) makes steps raise or
hang on demand.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

import zmq

from cadence.allocator import Trimmer, bound_onednn_cache, freeze_startup_objects, limit_arenas
from cadence.config import EngineConfig
from cadence.engine import protocol as P
from cadence.engine.fanout import OutputFanout, SendTimeout
from cadence.process import die_with_parent

if TYPE_CHECKING:
    from cadence.engine.core import EngineCore

logger = logging.getLogger("cadence.engine")

IDLE_POLL_MS = 1000  # with no work: wake up this often to check on the parent
MAX_CONSECUTIVE_STEP_FAILURES = 3
SEND_TIMEOUT_S = 60.0  # a send to the API server that waits longer: the server is gone
SEND_HWM = 1000  # messages queued towards the API server before a send waits


class EngineExit(Exception):
    """Leave the loop and the process with this exit code."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def run_engine_core(
    config: EngineConfig,
    in_addrs: list[str],
    out_addrs: list[str],
    log_level: int = logging.INFO,
    parent_pid: int | None = None,
    pdeathsig: bool = False,
) -> None:
    """Process entry point. `in_addrs`: where requests come from (one per API process, and
    the supervisor's own when it runs several); `out_addrs[i]`: API process i's output
    socket. Returns on SHUTDOWN or the parent's death; exits with code 1 after repeated
    step failures or a send that timed out."""
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    if pdeathsig and not die_with_parent(parent_pid):
        return  # the server died while we were starting
    try:
        from setproctitle import setproctitle

        setproctitle("cadence::engine")
    except ImportError:
        pass
    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server decides when we stop
    limit_arenas()  # before the grammar threads and torch's pools start
    bound_onednn_cache()  # before the first CPU matmul
    _setup_threads(config)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)  # fair-queued over every API process
    for addr in in_addrs:
        inbox.connect(addr)
    outboxes = [make_outbox(ctx, addr) for addr in out_addrs]
    code = 0
    try:
        code = _serve(config, inbox, OutputFanout(outboxes), parent_pid)
    except EngineExit as e:
        logger.error("engine exiting: %s", e)
        code = e.code
    finally:
        inbox.close(linger=0)
        for outbox in outboxes:
            outbox.close(linger=1000)  # let the last errors reach the server, within a bound
        ctx.term()
    if code:
        sys.exit(code)


def _setup_threads(config: EngineConfig) -> None:
    """A CPU engine with one rank owns this process: size and pin its thread pool."""
    import torch

    cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    if cpu and config.parallel.tensor_parallel_size == 1:
        from cadence.worker.cpu_threads import setup_cpu_threads

        p = config.parallel
        setup_cpu_threads(p.cpu_threads, p.cpu_bind_threads)


def _serve(config: EngineConfig, inbox: zmq.Socket, fanout: OutputFanout, parent_pid: int) -> int:
    from cadence.engine.core import EngineCore  # here: the torch-heavy part of start-up
    from cadence.engine.faults import install_from_env
    from cadence.executor.distributed import DistributedExecutor

    # A dead tensor-parallel rank ends this process at once; the API server then fails
    # every request and exits non-zero (a supervisor restarts the whole server).
    DistributedExecutor.exit_on_rank_death = True

    try:
        core = EngineCore(config)
    except Exception as e:
        logger.exception("engine start-up failed")
        msg = P.EngineCoreOutputs(errors=[("", f"engine start-up failed: {e}")])
        send_or_exit(fanout.broadcast, P.encoder.encode(msg))
        return 1
    install_from_env(core)
    runner = core.runner
    ready = P.EngineReady(
        runner.model_path,
        core.max_model_len,
        core.vocab_size,
        list(core.eos_token_ids),
        runner.num_blocks,
        config.cache.block_size,
        core.kv_connector.addr,
        core.pooling,
        runner.image_token_id,
        runner.pixel_dtype,
    )
    freeze_startup_objects()  # (a full collection walking them would stall a step)
    send_or_exit(fanout.broadcast, P.encoder.encode(ready))
    try:
        code = EngineLoop(core, inbox, fanout, parent_pid).run()
    finally:
        core.shutdown()
    if core.grammars.shutdown():
        # A compile thread is still inside xgrammar (one given up on): when it returns during
        # interpreter teardown the C++ runtime aborts the process. Leave without teardown.
        inbox.close(linger=0)
        for outbox in fanout.outboxes:
            outbox.close(linger=1000)
        logging.shutdown()
        os._exit(code)
    return code


def make_outbox(ctx: zmq.Context, addr: str, timeout_s: float = SEND_TIMEOUT_S) -> zmq.Socket:
    """The socket towards the API server: a send waits at most `timeout_s` for room."""
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.SNDHWM, SEND_HWM)
    outbox.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    outbox.connect(addr)
    return outbox


def send_or_exit(send, *args) -> None:
    """`send(*args)` (a fanout's), or raise EngineExit(1) if an API process took nothing
    for the send timeout."""
    try:
        send(*args)
    except SendTimeout:
        raise EngineExit(1, "the API server read nothing for the send timeout") from None


class EngineLoop:
    def __init__(
        self,
        core: EngineCore,
        inbox: zmq.Socket,
        fanout: OutputFanout,
        parent_pid: int,
    ) -> None:
        from cadence.engine.introspect import Introspection

        self.core = core
        self.introspection = Introspection(core)
        self.inbox = inbox
        self.fanout = fanout
        self.parent_pid = parent_pid
        self.errors: list[tuple[str, str]] = []
        self.step_errors: list[tuple[str, str]] = []
        self.running = True
        self.consecutive_failures = 0
        self._stats_dirty = False  # an add or abort changed the queues: report them
        self._trimmer = Trimmer()  # free heap back to the OS after bursts (allocator.py)
        self._last_send = time.monotonic()
        self._poller = zmq.Poller()
        self._poller.register(inbox, zmq.POLLIN)
        # A pipe from multiprocessing that reads EOF once the parent is gone (spawned
        # children only): lets an idle engine notice at once.
        parent = multiprocessing.parent_process()
        self._parent_sentinel = parent.sentinel if parent is not None else None
        if self._parent_sentinel is not None:
            self._poller.register(self._parent_sentinel, zmq.POLLIN)

    def run(self) -> int:
        """The loop; returns the process's exit code."""
        timeline = self.core.timeline
        try:
            while self.running:
                if os.getppid() != self.parent_pid:
                    raise EngineExit(0, "the API server process is gone")
                busy = self.core.has_unfinished_requests()
                self._drain_inbox(block=not busy)
                if not self.running:
                    break
                steps_before = timeline.num_steps
                updates = self._step() if self.core.has_unfinished_requests() else []
                self.errors.extend(self.core.take_failed())
                t_send = time.perf_counter()
                self._send(updates)
                if timeline.num_steps != steps_before:  # the step's outputs include the send
                    timeline.add_output_time(time.perf_counter() - t_send)
                if not self.core.has_unfinished_requests():
                    self.fanout.flush()  # the last stats, to every API process
                if busy:
                    self._trimmer.worked()
                self._trimmer.tick()
                self._introspection_chores()
                if self.consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                    raise EngineExit(1, f"{self.consecutive_failures} engine steps in a row failed")
        except EngineExit as e:
            (logger.error if e.code else logger.warning)("engine exiting: %s", e)
            return e.code
        finally:
            self.introspection.profiler.close()  # keep what was recorded
        return 0

    def _introspection_chores(self) -> None:
        """Between steps: answers that came later (a written trace), a profile past its
        time bound."""
        intro = self.introspection
        for reply in intro.finished_replies():
            send_or_exit(self.fanout.reply, reply)
        if intro.profiler.overdue():
            logger.warning("profile stopped after --profile-max-seconds")
            intro.profiler.stop()

    def _step(self) -> list:
        try:
            if self.introspection.profiler.active:
                from torch.profiler import record_function

                with record_function("cadence::step"):
                    updates = self.core.step()
            else:
                updates = self.core.step()
        except Exception as e:
            self.consecutive_failures += 1
            logger.exception(
                "engine step failed (%d in a row; the engine exits after %d)",
                self.consecutive_failures,
                MAX_CONSECUTIVE_STEP_FAILURES,
            )
            # If the core cannot be made consistent again, this raises and the process
            # dies with the traceback: the client then fails every request.
            ended = self.core.fail_step()
            why = f"the engine step computing this request failed ({type(e).__name__}: {e})"
            self.step_errors.extend((rid, why) for rid in ended)
            self._stats_dirty = True
            return []
        if updates:  # tokens came out: the engine works again
            self.consecutive_failures = 0
        return updates

    def _drain_inbox(self, block: bool) -> None:
        timeout = IDLE_POLL_MS if block else 0
        while True:
            ready = dict(self._poller.poll(timeout))
            if self._parent_sentinel is not None and self._parent_sentinel in ready:
                raise EngineExit(0, "the API server process is gone")
            if self.inbox not in ready:
                return
            timeout = 0
            kind, payload = self.inbox.recv_multipart()
            if kind == P.ADD:
                req = P.request_decoder.decode(payload)
                try:
                    self.fanout.own(req.request_id, req.client_index)
                    self.core.add_request(
                        req.request_id,
                        req.prompt_token_ids,
                        req.sampling_params,
                        req.arrival_time,
                        req.priority,
                        req.lora,
                        req.images,
                    )
                except ValueError as e:
                    self.errors.append((req.request_id, str(e)))
            elif kind == P.ABORT:
                ids = P.abort_decoder.decode(payload)
                logger.debug("abort %s", ids)
                self.core.abort(ids)
                self.fanout.forget(ids)
            elif kind == P.CALL:
                reply = self.introspection.answer(P.call_decoder.decode(payload))
                if reply is not None:  # (else it comes when ready: _introspection_chores)
                    send_or_exit(self.fanout.reply, reply)
                continue  # a question changes no queue
            elif kind == P.SHUTDOWN:
                self.running = False
                return
            self._stats_dirty = True

    def _send(self, updates) -> None:
        """Every message carries fresh stats (a few numbers). Idle and quiet, send nothing;
        busy and quiet, a heartbeat every HEARTBEAT_INTERVAL_S."""
        now = time.monotonic()
        if not (updates or self.errors or self.step_errors or self._stats_dirty):
            if now - self._last_send < P.HEARTBEAT_INTERVAL_S:
                return
            if not self.core.has_unfinished_requests():
                return
        s = self.core.stats()
        g = self.core.grammars.stats
        stats = P.EngineStats(
            s.num_running,
            s.num_waiting,
            s.kv_usage,
            s.num_preemptions,
            s.prefix_queries,
            s.prefix_hits,
            self.core.runner.num_blocks,
            s.prefix_requests,
            s.prefix_hit_requests,
            s.prefix_evictions,
            g.requests,
            g.compiles,
            g.cache_hits,
            g.jump_forward_tokens,
        )
        stats.num_preempted = s.num_preempted
        stats.kv_blocks_cached = s.kv_blocks_cached
        stats.num_steps = self.core.timeline.num_steps
        stats.prefill_cap, stats.decode_step_ms = s.prefill_cap, s.decode_step_ms
        if s.kv_transfer is not None:
            t = s.kv_transfer
            stats.kv_transfer_loads = t.num_loads
            stats.kv_transfer_loaded_tokens = t.num_loaded_tokens
            stats.kv_transfer_failed_loads = t.num_failed_loads
            stats.kv_transfer_load_seconds = t.load_seconds
            stats.kv_transfer_saved_tokens = t.num_saved_tokens
        if s.lora is not None:
            stats.lora_running = s.lora.running
            stats.lora_waiting = s.lora.waiting
            stats.lora_slot_loads = s.lora.slot_loads
        if (images := self.core.runner.image_totals) is not None:
            stats.images_encoded, stats.image_cache_hits, stats.image_tokens = images
        if s.spec is not None:
            stats.spec_verifications = s.spec.num_verifications
            stats.spec_draft_tokens = s.spec.num_draft_tokens
            stats.spec_accepted_tokens = s.spec.num_accepted_tokens
            stats.spec_accepted_per_position = list(s.spec.accepted_per_position)
            stats.spec_acceptance_lengths = list(s.spec.acceptance_lengths)
        msg = P.EngineCoreOutputs(updates, self.errors, stats, time.time(), self.step_errors)
        send_or_exit(self.fanout.send, msg)
        self.errors = []
        self.step_errors = []
        self._stats_dirty = False
        self._last_send = now
