"""The engine core in its own process: the busy loop behind two ZMQ sockets.

    loop:
        drain the inbox (block only when there is no work): add / abort / shutdown
        updates = core.step()
        send EngineCoreOutputs(updates, errors, stats)

The API server's process starts this one (spawn), reads one EngineReady, then streams.
If the parent dies, the loop notices within a second and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import zmq

from cadence.config import EngineConfig
from cadence.engine import protocol as P
from cadence.engine.core import EngineCore

logger = logging.getLogger("cadence.engine")

IDLE_POLL_MS = 1000  # with no work: wake up this often to check on the parent


def run_engine_core(
    config: EngineConfig, in_addr: str, out_addr: str, log_level: int = logging.INFO
) -> None:
    """Process entry point. Never returns normally until SHUTDOWN or the parent's death."""
    try:
        from setproctitle import setproctitle

        setproctitle("cadence::engine")
    except ImportError:
        pass
    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server decides when we stop
    parent = os.getppid()
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.connect(out_addr)
    try:
        core = EngineCore(config)
    except Exception as e:
        logger.exception("engine start-up failed")
        outbox.send(
            P.encoder.encode(P.EngineCoreOutputs(errors=[("", f"engine start-up failed: {e}")]))
        )
        time.sleep(0.5)
        return
    runner = core.runner
    outbox.send(
        P.encoder.encode(
            P.EngineReady(
                runner.model_path,
                core.max_model_len,
                core.vocab_size,
                list(core.eos_token_ids),
                runner.num_blocks,
                config.cache.block_size,
            )
        )
    )
    EngineLoop(core, inbox, outbox, parent).run()
    inbox.close(linger=0)
    outbox.close(linger=1000)
    ctx.term()


class EngineLoop:
    def __init__(
        self, core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int
    ) -> None:
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.parent_pid = parent_pid
        self.errors: list[tuple[str, str]] = []
        self.running = True
        self._stats_dirty = False  # an add or abort changed the queues: report them

    def run(self) -> None:
        while self.running:
            busy = self.core.has_unfinished_requests()
            self._drain_inbox(block=not busy)
            if not self.running:
                break
            updates = self.core.step() if self.core.has_unfinished_requests() else []
            self.errors.extend(self.core.take_failed())
            self._send(updates)
            if not busy and os.getppid() != self.parent_pid:
                logger.warning("API server process is gone; engine exiting")
                break

    def _drain_inbox(self, block: bool) -> None:
        timeout = IDLE_POLL_MS if block else 0
        while self.inbox.poll(timeout):
            timeout = 0
            kind, payload = self.inbox.recv_multipart()
            if kind == P.ADD:
                req = P.request_decoder.decode(payload)
                try:
                    self.core.add_request(
                        req.request_id,
                        req.prompt_token_ids,
                        req.sampling_params,
                        req.arrival_time,
                        req.priority,
                    )
                except ValueError as e:
                    self.errors.append((req.request_id, str(e)))
            elif kind == P.ABORT:
                ids = P.abort_decoder.decode(payload)
                logger.debug("abort %s", ids)
                self.core.abort(ids)
            elif kind == P.SHUTDOWN:
                self.running = False
                return
            self._stats_dirty = True

    def _send(self, updates) -> None:
        """Every message carries fresh stats (a few numbers); idle and quiet, send nothing."""
        if not (updates or self.errors or self._stats_dirty):
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
        self.outbox.send(
            P.encoder.encode(P.EngineCoreOutputs(updates, self.errors, stats, time.time()))
        )
        self.errors = []
        self._stats_dirty = False
