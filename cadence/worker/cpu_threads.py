"""Threads of a CPU engine: how many intra-op threads, and on which cores.

On a CPU every step is PyTorch's (and the fused kernels') OpenMP pool running over all
cores, then waiting at a barrier. A pool larger than the cores this process may use, or a
second pool (the tokenizer's, another library's), makes every barrier wait for a thread
that is not running. So the engine sizes one pool to the cores it owns and, in its own
process, pins thread i to core i (vLLM binds its CPU workers the same way).
"""

from __future__ import annotations

import logging
import os

import torch

from cadence.ops import cpu_ops

logger = logging.getLogger(__name__)


def engine_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def setup_cpu_threads(threads: int | None, bind: bool) -> list[int]:
    """Size the intra-op pool (`threads`, None: one per core) and, with `bind`, pin its
    threads one to a core. Call it in a process that only runs the engine: pinning makes
    the calling thread stay on the first core, and processes it spawns inherit that.
    Only a pool that takes every core of the mask is pinned: a smaller one shares the
    machine with something else (another engine started with the same flags would pin to
    the same first cores), so the OS places it. To give an engine its own cores, narrow
    its affinity mask (taskset, a cpuset, or the data-parallel launcher, which does).
    Returns the cores used (empty: not pinned)."""
    cores = engine_cores()
    n = threads or len(cores)
    if n > len(cores):
        logger.warning("%d CPU threads on %d cores: the threads will contend", n, len(cores))
    torch.set_num_threads(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no second pool in the engine
    if not bind or n != len(cores) or (ops := cpu_ops.ops()) is None:
        return []
    chosen = cores[:n]
    ops.bind_threads(chosen)
    logger.info("CPU engine: %d intra-op threads pinned to cores %s", n, chosen)
    return chosen
