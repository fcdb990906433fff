"""A one-shot all-reduce for small messages between GPUs of one host (NVLink).

NCCL's ring and tree all-reduces pay several hops of latency, which dominates for the few
KiB a decode step reduces per layer (batch x hidden x 2 bytes: 8 KiB at batch 1 for a
4,096-wide model, twice per layer). In a one-shot all-reduce every rank copies its input
into a buffer its peers can read (PyTorch's symmetric memory maps each rank's buffer into
the others' address space), then each rank reads all peers' buffers and sums them itself:
one hop, one kernel, capturable in a CUDA graph. It moves size x (ranks - 1) bytes per
rank instead of ~2 x size, so it only wins for small messages; `fits` sends the rest to
NCCL. The crossover was measured on 2 H200s (benchmarks/all_reduce_sweep.py).

No NVLink multicast (multimem) is used: it is off on the machines we are lent.
"""

from __future__ import annotations

import warnings

import torch

# All-reduces up to this many bytes take the one-shot kernel; larger ones NCCL. On 2 H200s
# (NVLink, CUDA graphs, tp_s1 in benchmarks/results/h200) the one-shot took 6.4 us against
# NCCL's 15.7 at 4-64 KiB, 10.8 against 23.9 at 512 KiB, 35 against 45 at 4 MiB, and lost
# at 8 MiB (61.5 against 59.2): 4 MiB (a 512-token step of a 4,096-wide bf16 model).
ONE_SHOT_MAX_BYTES = 4 * 2**20


class OneShotAllReduce:
    def __init__(self, group, device: torch.device, max_bytes: int, dtype: torch.dtype) -> None:
        from torch.distributed import _symmetric_memory as symm_mem

        self.dtype = dtype
        self.max_numel = max_bytes // torch.finfo(dtype).bits * 8
        self.group_name = group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before rendezvous in older PyTorch; deprecated since
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable(self.group_name)
        self.buffer = symm_mem.empty(self.max_numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)  # collective: every rank calls it

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.dtype == self.dtype and x.numel() <= self.max_numel

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `x`, as a new tensor of its shape."""
        n = x.numel()
        out = torch.ops.symm_mem.one_shot_all_reduce_copy(
            self.buffer[:n], x.reshape(-1), "sum", self.group_name
        )
        return out.view(x.shape)
