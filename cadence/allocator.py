"""glibc malloc settings for the server's two processes: few arenas, and free memory
handed back to the OS after bursts of work.

Why (issue 14, point 9; measured with benchmarks/rss_rounds.py). Under a mixed load the
server's RSS rose by hundreds of MiB and stayed there, although Python's own objects did
not grow (gc counts flat from round to round). The memory was glibc's, free but kept:
- every thread that allocates can get its own arena (up to 8 per core), and a chunk freed
  into one arena serves only that arena's later requests. The server has many allocating
  threads (the engine's grammar compiles, the API's thread pool for templates, grammars
  and tokenization, ZMQ's I/O thread, tokenizers' pool);
- the first large buffer freed raises glibc's mmap threshold (up to 32 MiB), after which
  the activations of a forward pass of that size come from the heap, not from mmap, and
  freed heap memory returns to the OS only when it sits at the heap's top.
`malloc_trim(0)` releases every free page of every arena (madvise), in milliseconds, so
the engine calls it when it turns idle after work and now and then under steady load,
and the API server likewise from a background task. `limit_arenas` caps the arenas
before the process's threads start; an explicit MALLOC_ARENA_MAX in the environment wins.

Everything here is a no-op off glibc (macOS, musl): RSS there is the platform's affair.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import time

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt parameter numbers, from <malloc.h>
DEFAULT_MAX_ARENAS = 2
DEFAULT_IDLE_AFTER_S = 0.5  # idle this long after work before trimming
DEFAULT_BUSY_INTERVAL_S = 30.0  # under steady load, trim at most this often

_libc: ctypes.CDLL | None | bool = None  # None: not looked up yet; False: not glibc


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
                _ = lib.gnu_get_libc_version  # only glibc has it (AttributeError otherwise)
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc or None


def limit_arenas(max_arenas: int = DEFAULT_MAX_ARENAS) -> bool:
    """Cap glibc's malloc arenas at `max_arenas`. Call before the process starts threads
    (arenas made earlier stay). Returns whether the cap was set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False  # the operator's choice
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, max_arenas))


# oneDNN (torch's CPU matmuls) keeps a compiled primitive per input shape, 1,024 by default;
# a step's token count is a new shape, so over a long serving session the cache fills with
# hundreds of MiB (measured: ~680 MiB live after 1,200 token counts on SmolLM2's four
# linear shapes). 256 keeps the steady state as fast (same-shape and 32 cycling shapes
# measured equal to the default) and bounds the rest.
ONEDNN_CACHE_CAPACITY = 256


def bound_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Cap oneDNN's primitive cache unless the environment already sets it. oneDNN reads the
    variable when it creates its first primitive: call before the first CPU matmul."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))


def trim() -> bool:
    """Hand every free page of the heap and arenas back to the OS. Returns whether any
    memory was released (False off glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


class Trimmer:
    """Decides when to trim, from calls the owner's loop makes: `worked()` after a unit
    of work (an engine step, a request), `tick()` on each pass of the loop. It trims once
    the process has been idle `idle_after_s` after work, and at most every
    `busy_interval_s` while work goes on without a pause. Times are seconds."""

    def __init__(
        self,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        busy_interval_s: float = DEFAULT_BUSY_INTERVAL_S,
        clock=time.monotonic,
    ) -> None:
        self.idle_after_s = idle_after_s
        self.busy_interval_s = busy_interval_s
        self.clock = clock
        self.trims = 0
        self._dirty = False  # work since the last trim
        self._last_work = self._last_trim = clock()
        self.enabled = _glibc() is not None

    def worked(self) -> None:
        self._dirty = True
        self._last_work = self.clock()

    def tick(self) -> bool:
        """Trim if it is time; returns whether it trimmed."""
        if not (self.enabled and self._dirty):
            return False
        now = self.clock()
        idle = now - self._last_work >= self.idle_after_s
        if not idle and now - self._last_trim < self.busy_interval_s:
            return False
        t0 = time.perf_counter()
        trim()
        self.trims += 1
        self._dirty = False
        self._last_trim = self.clock()
        logger.debug("malloc_trim(0) in %.1f ms", (time.perf_counter() - t0) * 1e3)
        return True


__all__ = ["Trimmer", "limit_arenas", "trim"]


def freeze_startup_objects() -> None:
    """Take what start-up built (imported libraries, the tokenizer or the model's modules,
    the app: ~135,000 objects in an API process, ~250,000 in a tiny model's engine) out of the
    garbage collector for good: it lives as long as the process, and a full collection that
    walked it stalled every stream of an API process for ~155 ms (issue 37). Call it once a
    long-lived process is ready, before it serves."""
    gc.collect()
    gc.freeze()
