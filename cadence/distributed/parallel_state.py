"""The tensor-parallel group of this process: one per process, set once at start-up.

Every rank of a tensor-parallel engine is one process (the engine core's own process is
rank 0; the executor starts the others) with one device. They join one torch.distributed
group: NCCL between GPUs, gloo between CPU processes. With one rank nothing is joined and
every collective in `communication` returns its input: the TP=1 path runs no new code.

Layers read `get_tp()` when they are built (which shard they hold) and the collectives
read it when they run.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cadence.distributed.one_shot import OneShotAllReduce

logger = logging.getLogger(__name__)

# How long joining the group may take (workers still importing torch, loading, ...).
INIT_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass
class TensorParallelGroup:
    rank: int
    size: int
    device: torch.device
    group: object | None = None  # the torch.distributed ProcessGroup; None for one rank
    one_shot: OneShotAllReduce | None = None  # fast small all-reduces (CUDA), if enabled

    @property
    def is_driver(self) -> bool:
        """Rank 0: the engine core's process, which samples and reads results back."""
        return self.rank == 0


_TP = TensorParallelGroup(rank=0, size=1, device=torch.device("cpu"))


def get_tp() -> TensorParallelGroup:
    return _TP


_EXPERT_PARALLEL = [False]


@contextlib.contextmanager
def expert_parallel_scope(enabled: bool) -> Iterator[None]:
    """Build the layers inside with experts split across the ranks (each rank holds
    E / size whole experts) instead of each expert's columns (`--enable-expert-parallel`)."""
    _EXPERT_PARALLEL.append(enabled)
    try:
        yield
    finally:
        _EXPERT_PARALLEL.pop()


def expert_parallel() -> bool:
    """Whether experts being built now are split whole across more than one rank."""
    return _EXPERT_PARALLEL[-1] and _TP.size > 1


def init_tensor_parallel(
    rank: int,
    size: int,
    device: torch.device,
    init_method: str,
    bind_address: str = "127.0.0.1",
    listen=None,
) -> TensorParallelGroup:
    """Join the group (blocks until all `size` ranks have). `init_method`: file://PATH (one
    host) or tcp://HOST:PORT of rank 0 (rendezvous.py; rank 0 serves it on `listen` when
    given). gloo / NCCL bind the interface of `bind_address`, this rank's own address. One
    rank joins nothing."""
    global _TP
    if size == 1:
        _TP = TensorParallelGroup(0, 1, device)
        return _TP
    import torch.distributed as dist

    from cadence.distributed.rendezvous import make_store, pin_interfaces

    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed group")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    pin_interfaces(bind_address)
    dist.init_process_group(
        backend,
        store=make_store(rank, size, init_method, INIT_TIMEOUT, listen),
        rank=rank,
        world_size=size,
        timeout=INIT_TIMEOUT,
        **kwargs,
    )
    _TP = TensorParallelGroup(rank, size, device, dist.group.WORLD)
    logger.info("rank %d of %d joined the tensor-parallel group (%s)", rank, size, backend)
    return _TP


def enable_one_shot(max_bytes: int, dtype: torch.dtype) -> None:
    """Route all-reduces up to `max_bytes` of `dtype` through the one-shot kernel (CUDA,
    more than one rank). Every rank must call it (the buffers' rendezvous is collective)."""
    if _TP.size == 1 or _TP.device.type != "cuda":
        return
    from cadence.distributed.one_shot import OneShotAllReduce

    _TP.one_shot = OneShotAllReduce(_TP.group, _TP.device, max_bytes, dtype)


def destroy_tensor_parallel(timeout_s: float = 10.0, graceful: bool = True) -> None:
    """Leave the group (shutdown). Every rank must leave at about the same time: NCCL's
    teardown waits on its peers. It runs on a daemon thread, given `timeout_s`, and is
    abandoned after that. Not `graceful` (a rank died, or a step broke): only forget the
    group here; the process is about to exit."""
    global _TP
    if _TP.size > 1 and graceful:
        import threading

        import torch.distributed as dist

        _TP.one_shot = None
        if dist.is_initialized():
            leave = dist.destroy_process_group
            done = threading.Thread(target=leave, daemon=True)
            done.start()
            done.join(timeout_s)
            if done.is_alive():
                logger.warning("leaving the tensor-parallel group timed out; abandoned")
    _TP = TensorParallelGroup(0, 1, torch.device("cpu"))
