"""Worker threads that compile grammars, each compile bounded in time.

A grammar compile is C++ code (xgrammar) that cannot be interrupted, and a pathological
schema can keep it busy for minutes. So a compile that runs past the time bound is not
stopped but *abandoned*: its job is reported as expired (the manager fails the requests
waiting on it), and its thread leaves the pool; when the compile eventually returns, the
thread exits. A fresh thread takes its place, so the pool keeps serving other grammars.

Abandoned threads still burn a CPU core each, so their number is bounded: the pool never
holds more than `threads + max_abandoned` threads. Past that, an expired thread is not
replaced, and the pool shrinks; a pool with no thread left refuses every compile at once
(CompilerBusy) until an abandoned compile returns and its thread is replaced.

Threads are daemons: a process that exits must not wait for a compile it gave up on (the
threads of concurrent.futures' executor are joined at exit).

xgrammar releases the GIL while it compiles (measured: the engine loop's longest pause was
32 ms during a 10 s compile), so a slow compile costs a core, not the engine loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field


class CompilerBusy(RuntimeError):
    """No thread is left to compile: they are all stuck in compiles past the time bound."""


@dataclass(eq=False)
class _Worker:
    thread: threading.Thread | None = None
    abandoned: bool = False  # set when its compile expired; it exits once that returns


@dataclass(eq=False)
class CompileJob:
    key: str
    fn: Callable[[], object]
    future: Future = field(default_factory=Future)
    started: float | None = None  # time.monotonic() when a worker began it; None: queued
    worker: _Worker | None = None


class CompilePool:
    def __init__(
        self,
        threads: int,
        timeout: float,
        max_abandoned: int,
        setup: Callable[[], object] | None = None,
        name: str = "cadence-grammar",
    ) -> None:
        """`timeout`: seconds a job may run, counted from when a worker starts it, after
        `setup` (say, building the vocabulary once), which is not counted."""
        self.threads = threads
        self.timeout = timeout
        self.max_abandoned = max_abandoned
        self._setup = setup
        self._name = name
        self._queue: queue.SimpleQueue[CompileJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._active: set[_Worker] = set()
        self._abandoned: set[_Worker] = set()
        self._running: set[CompileJob] = set()
        self._spawned = 0
        self._closed = False
        with self._lock:
            self._top_up()

    # ---- the manager's side -----------------------------------------------------------

    def submit(self, key: str, fn: Callable[[], object]) -> CompileJob:
        """Queue `fn`; its job's future holds the result, or CompilerBusy at once."""
        job = CompileJob(key, fn)
        with self._lock:
            if self._closed or not self._active:
                job.future.set_exception(CompilerBusy(self._busy_message()))
                return job
            self._queue.put(job)
        return job

    def expired(self) -> list[CompileJob]:
        """Jobs running past the timeout. Their threads are abandoned and replaced (while
        the bound allows); each job is returned once and its future is never set after."""
        now = time.monotonic()
        with self._lock:
            late = [
                j
                for j in self._running
                if not j.future.done() and now - (j.started or now) > self.timeout
            ]
            for job in late:
                self._running.discard(job)
                worker = job.worker
                assert worker is not None
                worker.abandoned = True
                self._active.discard(worker)
                self._abandoned.add(worker)
            if late:
                self._top_up()
                if not self._active:
                    self._fail_queued()
        return late

    def next_deadline(self) -> float | None:
        """The monotonic time at which the earliest running job expires, if any runs."""
        with self._lock:
            starts = [j.started for j in self._running if j.started is not None]
        return min(starts) + self.timeout if starts else None

    @property
    def num_abandoned(self) -> int:
        """Threads still running a compile the pool gave up on."""
        with self._lock:
            return len(self._abandoned)

    @property
    def num_busy(self) -> int:
        """Threads inside a job now, abandoned or not. A daemon thread that returns from
        xgrammar while the interpreter finalizes aborts the process (SIGABRT, measured),
        so a process exiting with busy threads should end with os._exit."""
        with self._lock:
            return len(self._running) + len(self._abandoned)

    @property
    def num_active(self) -> int:
        with self._lock:
            return len(self._active)

    def shutdown(self) -> None:
        """Stop the idle threads; busy ones exit after their job (they are daemons)."""
        with self._lock:
            self._closed = True
            for _ in self._active:
                self._queue.put(None)
            self._fail_queued()

    # ---- inside -----------------------------------------------------------------------

    def _busy_message(self) -> str:
        return (
            f"the grammar compiler is busy: {len(self._abandoned)} earlier compiles ran past "
            f"--grammar-compile-timeout ({self.timeout:g} s) and are still running; "
            "retry later"
        )

    def _top_up(self) -> None:
        """Start threads up to `threads` active, within the bound. Holds the lock."""
        while (
            not self._closed
            and len(self._active) < self.threads
            and len(self._active) + len(self._abandoned) < self.threads + self.max_abandoned
        ):
            worker = _Worker()
            self._spawned += 1
            worker.thread = threading.Thread(
                target=self._run, args=(worker,), name=f"{self._name}-{self._spawned}", daemon=True
            )
            self._active.add(worker)
            worker.thread.start()

    def _fail_queued(self) -> None:
        """Fail every queued job (no thread will take them). Holds the lock."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self._queue.put(None)  # a shutdown signal: leave it for a thread
                return
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(CompilerBusy(self._busy_message()))

    def _run(self, worker: _Worker) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                with self._lock:
                    self._active.discard(worker)
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                if self._setup is not None:
                    self._setup()
                with self._lock:
                    job.started, job.worker = time.monotonic(), worker
                    self._running.add(job)
                result = job.fn()
            except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future
                error: BaseException | None = e
            else:
                error = None
            with self._lock:
                self._running.discard(job)
                if not worker.abandoned:
                    if error is None:
                        job.future.set_result(result)
                    else:
                        job.future.set_exception(error)
                    continue
                # The pool gave up on this job: drop its result, leave, make room.
                self._abandoned.discard(worker)
                self._top_up()
                return
