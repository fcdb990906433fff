"""Executors: how the engine core reaches the model's ranks (see base.py)."""

from __future__ import annotations

from cadence.config import EngineConfig
from cadence.executor.base import Executor


def make_executor(config: EngineConfig) -> Executor:
    p = config.parallel
    backend = p.distributed_executor_backend
    if backend == "auto":
        backend = "uniproc" if p.tensor_parallel_size == 1 else "mp"
    if backend == "uniproc":
        from cadence.executor.uniproc import UniprocExecutor

        return UniprocExecutor(config)
    if backend == "mp":
        from cadence.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)
    from cadence.executor.ray_executor import RayExecutor

    return RayExecutor(config)
