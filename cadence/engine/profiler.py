"""torch.profiler in the engine process, started and stopped from the API server.

    POST /start_profile  ->  EngineProfiler.start()    CPU activity, and CUDA on a GPU
    POST /stop_profile   ->  EngineProfiler.stop()     stops recording (engine thread); the
                                                       trace DIR/cadence-engine-*.pt.trace.json.gz
                                                       is written on a writer thread

The trace is Chrome's trace-event format (gzipped), which Perfetto (ui.perfetto.dev) and
chrome://tracing open. Each engine step shows as a `cadence::step` range. With tensor
parallelism only the engine process (rank 0) is profiled.

Bounded, because whoever can start it can otherwise stall or fill the machine (the
endpoints need the admin key too): a profile stops by itself after `max_seconds`; writing
the trace (seconds for a busy GPU) happens off the engine thread, which keeps stepping; a
trace appears under its name only once complete; only the newest `max_traces` traces are
kept in the folder; memory the export used goes back to the OS. Stopping itself (torch's
`_disable_profiler`, which post-processes what was recorded) must run on the thread that
started the profile, the engine's: measured on the CPU, about 0.2 s per second recorded
(0.5 s with record_shapes), which max_seconds also bounds.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

from cadence.allocator import trim

logger = logging.getLogger(__name__)

TRACE_PREFIX = "cadence-engine-"
TRACE_SUFFIX = ".pt.trace.json.gz"


class ProfilerError(RuntimeError):
    """A start or stop that cannot be done (no --profile-dir, already running, ...)."""


class EngineProfiler:
    def __init__(
        self, out_dir: str | None, max_seconds: float = 60.0, max_traces: int = 10
    ) -> None:
        self.out_dir = out_dir
        self.max_seconds = max_seconds
        self.max_traces = max_traces
        self._prof = None
        self._started = 0.0
        self._writer: ThreadPoolExecutor | None = None
        self._writing: Future | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def overdue(self) -> bool:
        """Recording for longer than max_seconds (the engine loop then stops it)."""
        return self._prof is not None and time.monotonic() - self._started > self.max_seconds

    def start(self, record_shapes: bool = False) -> dict:
        """Start recording. `record_shapes` adds each operator's input shapes (and makes
        stopping, which runs on the engine thread, about 2.5x as long: off by default, as
        in vLLM)."""
        if not isinstance(record_shapes, bool):
            raise ProfilerError("record_shapes must be true or false")
        if self.out_dir is None:
            raise ProfilerError("profiling is off: start the server with --profile-dir DIR")
        if self._prof is not None:
            raise ProfilerError("a profile is already being recorded; POST /stop_profile first")
        if self._writing is not None and not self._writing.done():
            raise ProfilerError("the last trace is still being written; try again shortly")
        import torch
        from torch.profiler import ProfilerActivity, profile

        os.makedirs(self.out_dir, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=record_shapes)
        prof.start()
        self._prof = prof
        self._started = time.monotonic()
        logger.info(
            "profiler started (%s; stops by itself after %g s)",
            ", ".join(a.name for a in activities),
            self.max_seconds,
        )
        return {
            "profiling": True,
            "activities": [a.name for a in activities],
            "max_seconds": self.max_seconds,
        }

    def stop(self) -> Future:
        """Stop recording now (call it on the engine thread); a future of the answer
        ({"trace": path, ...}), set once the writer thread has written the trace."""
        if self._prof is None:
            raise ProfilerError("no profile is being recorded; POST /start_profile first")
        prof, self._prof = self._prof, None
        prof.stop()
        seconds = time.monotonic() - self._started
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{TRACE_PREFIX}{stamp}-{os.getpid()}-{int(time.time() * 1000) % 1000:03d}"
        path = os.path.join(self.out_dir, name + TRACE_SUFFIX)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="cadence-profile-writer")
        # (in a list the writer empties: then its `del` drops the last reference)
        self._writing = self._writer.submit(self._write, [prof], path, seconds)
        return self._writing

    def _write(self, held: list, path: str, seconds: float) -> dict:
        t0 = time.monotonic()
        prof = held.pop()
        # Written under a hidden name (same suffix: torch gzips by it), then renamed.
        partial = os.path.join(os.path.dirname(path), "." + os.path.basename(path))
        try:
            prof.export_chrome_trace(partial)
            os.replace(partial, path)  # complete, or not there at all
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
            del prof  # the recorded events: the export's memory goes back to the OS below
            trim()
        removed = self._prune()
        logger.info(
            "profile of %.1f s written to %s in %.1f s%s",
            seconds,
            path,
            time.monotonic() - t0,
            f" ({removed} older traces removed)" if removed else "",
        )
        return {"profiling": False, "trace": path, "seconds": round(seconds, 3)}

    def _prune(self) -> int:
        """Keep the newest max_traces traces of this folder; the number removed."""
        traces = sorted(
            glob.glob(os.path.join(glob.escape(self.out_dir), f"{TRACE_PREFIX}*{TRACE_SUFFIX}")),
            key=os.path.getmtime,
        )
        old = traces[: max(0, len(traces) - self.max_traces)]
        for trace in old:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(trace)
        return len(old)

    def close(self, timeout_s: float = 60.0) -> None:
        """At exit: stop an active profile and wait (a while) for its trace."""
        if self._prof is not None:
            self.stop()
        if self._writing is not None:
            try:
                self._writing.result(timeout_s)
            except Exception:
                logger.exception("writing the last profile failed")
        if self._writer is not None:
            self._writer.shutdown(wait=False)
