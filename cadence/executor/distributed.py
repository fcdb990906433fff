"""Rank 0 in this process, ranks 1..N-1 elsewhere: what the mp and Ray executors share.

    start the other ranks (subclass: processes, or Ray actors)    they join the group
    join the group as rank 0; build rank 0's runner               collectives pair up
    wait for every rank's "ready"
    each step: ops to every rank (step_channel.py), then rank 0's own call

A rank that dies takes the engine down, never into a hang: a watchdog thread learns of
the death at once (the process's exit, or the Ray task's end). The next call raises; a
call blocked in a collective with the dead rank raises on its own with gloo, and with
NCCL (which would wait out its timeout) the process exits after DEATH_GRACE_S. The
server's engine process exits at once (`exit_on_rank_death`): the API server then fails
every request and exits non-zero.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import time
from abc import abstractmethod
from contextlib import contextmanager, suppress

from cadence.config import EngineConfig
from cadence.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from cadence.distributed.rendezvous import listen_socket
from cadence.executor import step_messages as M
from cadence.executor.base import Executor, drafter_factory
from cadence.executor.step_channel import StepChannel
from cadence.executor.worker import WorkerSpec
from cadence.layers.linear import check_shardable
from cadence.loader.gguf import ensure_float_weights
from cadence.loader.loader import load_hf_config
from cadence.loader.model_path import resolve_model_path
from cadence.platform import pick_device
from cadence.private_dirs import make_private_dir
from cadence.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

DEATH_GRACE_S = 5.0
READY_TIMEOUT_S = 600.0


class DistributedExecutor(Executor):
    # Set by the server's engine process: a dead rank ends the process at once.
    exit_on_rank_death = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.size = config.parallel.tensor_parallel_size
        self.device_type = pick_device(config.device).type
        self._dead: str | None = None
        self._in_call = False
        self._closed = False
        self._broken = False
        model_path = resolve_model_path(config.model.model)  # a GGUF's metadata, once
        if config.model.load_format != "dummy":
            ensure_float_weights(model_path)  # a GGUF serves expanded over ranks: once, here
        check_shardable(load_hf_config(model_path), self.size)  # before starting any rank
        try:
            self._start(config, model_path)
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)  # a caller that never shuts down still leaves cleanly
        logger.info("%d tensor-parallel ranks ready (%s)", self.size, type(self).__name__)

    def _start(self, config: EngineConfig, model_path: str) -> None:
        host = self._prepare()
        listen = None
        if self.same_host:  # sockets and the rendezvous in a directory only we can open
            self._dir = make_private_dir("cadence-tp-")
            self.channel = StepChannel(self.size - 1, self._check_alive, ipc_dir=self._dir)
            init_method = f"file://{os.path.join(self._dir, 'rendezvous')}"
        else:  # over the network, on the one address the ranks reach us at
            self.channel = StepChannel(self.size - 1, self._check_alive, host=host)
            listen = listen_socket(host, config.parallel.distributed_init_port or 0)
            init_method = f"tcp://{host}:{listen.getsockname()[1]}"
        specs = [
            WorkerSpec(
                config,
                rank,
                self.size,
                self._worker_device(rank),
                init_method,
                self.channel.step_addrs[rank - 1],
                self.channel.control_addr,
                model_path,
                self.channel.rank_keys,
                self.channel.server_public,
                bind_address=host,
                log_level=logging.getLogger("cadence").getEffectiveLevel(),
            )
            for rank in range(1, self.size)
        ]
        self._launch(specs)
        threading.Thread(target=self._watch, name="cadence-rank-watchdog", daemon=True).start()
        with self._call():
            init_tensor_parallel(0, self.size, self._driver_device(), init_method, host, listen)
            self.driver = ModelRunner(config, model_path, drafter_factory(config))
        self.channel.wait_ready(READY_TIMEOUT_S, self._check_alive)

    # ---- what subclasses provide -------------------------------------------------------

    # Every rank on this host (mp): ipc:// sockets and a file rendezvous in a private
    # directory. Otherwise (Ray) TCP on the address _prepare() returns.
    same_host = True

    @abstractmethod
    def _prepare(self) -> str:
        """Get ready to start ranks (Ray: join or start a cluster, place the ranks); the
        address the other ranks reach this process at."""
        ...

    @abstractmethod
    def _driver_device(self): ...

    @abstractmethod
    def _worker_device(self, rank: int) -> str: ...

    @abstractmethod
    def _launch(self, specs: list[WorkerSpec]) -> None: ...

    @abstractmethod
    def _wait_for_death(self) -> str | None:
        """Block until a rank ends; its description, or None if we are shutting down."""
        ...

    @abstractmethod
    def _stop_ranks(self) -> None:
        """After "shutdown" was sent: wait briefly for the ranks to exit, then kill them."""

    # ---- one step ----------------------------------------------------------------------

    @property
    def recoverable(self) -> bool:
        return False

    def execute_model(self, sched):
        self._check_alive()
        self.channel.send(M.exec_op(sched))
        with self._call():
            return self.driver.execute_model(sched)

    def sample_async(self, model_out, grammar_bitmask=None):
        with self._call():
            return self.driver.sample_async(model_out, grammar_bitmask)

    def resolve(self, pending):
        if pending is not None:
            self.channel.send(M.Resolve(), now=False)
        with self._call():
            return self.driver.resolve(pending)

    @contextmanager
    def _call(self):
        self._check_alive()
        self._in_call = True
        try:
            yield
        except BaseException:
            self._broken = True
            self._check_alive()  # a dead rank is the better explanation
            raise
        finally:
            self._in_call = False

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise RuntimeError(f"a tensor-parallel rank died: {self._dead}")

    # ---- death and shutdown ------------------------------------------------------------

    def _watch(self) -> None:
        why = self._wait_for_death()
        if why is None or self._closed:
            return
        reported = self.channel_error()
        self._dead = f"{why}{f' ({reported})' if reported else ''}"
        logger.error("tensor-parallel %s; the engine cannot go on", self._dead)
        if self.exit_on_rank_death:
            logging.shutdown()
            os._exit(1)
        deadline = time.monotonic() + DEATH_GRACE_S
        while time.monotonic() < deadline:
            if not self._in_call:
                return  # the next call raises
            time.sleep(0.05)
        logger.critical(
            "rank 0 is still blocked on the dead rank after %.0f s: exiting", DEATH_GRACE_S
        )
        logging.shutdown()
        os._exit(1)

    def channel_error(self) -> str | None:
        try:
            return self.channel.last_error()  # (the watchdog starts after the channel)
        except Exception:  # the channel may be closing
            return None

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        graceful = not (self._broken or self._dead)
        channel = getattr(self, "channel", None)
        if channel is not None:
            with suppress(Exception):
                channel.send(M.Shutdown(), block=False)
        try:
            # The ranks leave the group as they read "shutdown"; rank 0 leaves with them.
            destroy_tensor_parallel(graceful=graceful)
        finally:
            try:
                self._stop_ranks()
            finally:
                if channel is not None:
                    channel.close()
                if getattr(self, "_dir", None):
                    shutil.rmtree(self._dir, ignore_errors=True)
