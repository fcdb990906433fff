"""torch.profiler in the engine process, started and stopped from the API server.

    POST /start_profile  ->  EngineProfiler.start()    CPU activity, and CUDA on a GPU
    POST /stop_profile   ->  EngineProfiler.stop()     writes DIR/cadence-engine-*.pt.trace.json.gz

The trace is Chrome's trace-event format (gzipped), which Perfetto (ui.perfetto.dev) and
chrome://tracing open. Each engine step shows as a `cadence::step` range. With tensor
parallelism only the engine process (rank 0) is profiled.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)


class ProfilerError(RuntimeError):
    """A start or stop that cannot be done (no --profile-dir, already running, ...)."""


class EngineProfiler:
    def __init__(self, out_dir: str | None) -> None:
        self.out_dir = out_dir
        self._prof = None
        self._started = 0.0

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self) -> dict:
        if self.out_dir is None:
            raise ProfilerError("profiling is off: start the server with --profile-dir DIR")
        if self._prof is not None:
            raise ProfilerError("a profile is already being recorded; POST /stop_profile first")
        import torch
        from torch.profiler import ProfilerActivity, profile

        os.makedirs(self.out_dir, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=True)
        prof.start()
        self._prof = prof
        self._started = time.monotonic()
        logger.info("profiler started (%s)", ", ".join(a.name for a in activities))
        return {"profiling": True, "activities": [a.name for a in activities]}

    def stop(self) -> dict:
        if self._prof is None:
            raise ProfilerError("no profile is being recorded; POST /start_profile first")
        prof, self._prof = self._prof, None
        prof.stop()
        seconds = time.monotonic() - self._started
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = os.path.join(self.out_dir, f"cadence-engine-{stamp}-{os.getpid()}.pt.trace.json.gz")
        t0 = time.monotonic()
        prof.export_chrome_trace(path)
        logger.info(
            "profile of %.1f s written to %s in %.1f s", seconds, path, time.monotonic() - t0
        )
        return {"profiling": False, "trace": path, "seconds": round(seconds, 3)}
