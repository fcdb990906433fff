"""Memory diagnostics for benchmarks/rss_rounds.py (`--memdebug DIR`); not part of Cadence.

Put this folder on PYTHONPATH and set CADENCE_MEMDEBUG=DIR: every Python process started
with that environment (the API server and its spawned engine) then answers
- SIGUSR1: writes DIR/<pid>-<n>.txt with gc object counts by type and, if tracemalloc
  runs (PYTHONTRACEMALLOC=N), the traced total and the top allocation sites, and the
  growth per site since the process's first dump;
- SIGUSR2: calls glibc's malloc_trim(0), which hands free heap pages back to the OS, so
  RSS before and after tells live memory from memory the allocator keeps.
The handlers run in the main thread, between bytecodes (the engine: between steps).
"""

import os
import signal

_DIR = os.environ.get("CADENCE_MEMDEBUG")


def _dump(signum, frame) -> None:
    import collections
    import gc
    import sys
    import tracemalloc

    _dump.n = getattr(_dump, "n", 0) + 1
    gc.collect()
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    lines = [f"pid {os.getpid()} argv {sys.argv[:3]} dump {_dump.n}",
             f"gc objects {sum(counts.values())}"]  # fmt: skip
    lines += [f"  {k}: {v}" for k, v in counts.most_common(25)]
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        cur, peak = tracemalloc.get_traced_memory()
        lines.append(f"tracemalloc current {cur / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB")
        base = getattr(_dump, "base", None)
        if base is None:
            _dump.base = snap
        else:
            lines.append("growth since the first dump:")
            lines += [f"  {s}" for s in snap.compare_to(base, "lineno")[:25]]
        lines.append("top now:")
        lines += [f"  {s}" for s in snap.statistics("lineno")[:25]]
    with open(os.path.join(_DIR, f"{os.getpid()}-{_dump.n}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _trim(signum, frame) -> None:
    import contextlib
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


if _DIR:
    signal.signal(signal.SIGUSR1, _dump)
    signal.signal(signal.SIGUSR2, _trim)
