"""Collectives over the tensor-parallel group. Each returns its input untouched when the
group has one rank, so layers call them unconditionally.

    all_reduce(x)         sum over ranks (row-parallel outputs, the vocab embedding);
                          small CUDA messages take the one-shot kernel when enabled
    all_gather_last(x)    concatenate the ranks' pieces along the last dim (logits)
    broadcast_(x)         rank 0's tensor, in place, on every rank (sampled token ids)
    min_over_ranks(n)     the smallest of an int across ranks (KV blocks every rank fits)
"""

from __future__ import annotations

import torch

from cadence.distributed.parallel_state import get_tp


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    tp = get_tp()
    if tp.size == 1:
        return x
    if tp.one_shot is not None and tp.one_shot.fits(x):
        return tp.one_shot.all_reduce(x)
    import torch.distributed as dist

    dist.all_reduce(x, group=tp.group)
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """[..., n] on each rank -> [..., size * n], rank r's piece at [r * n, (r + 1) * n)."""
    tp = get_tp()
    if tp.size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    if x.is_cuda:
        out = torch.empty((tp.size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=tp.group)
        pieces = out.unbind(0)
    else:  # gloo has no all_gather_into_tensor
        pieces = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(pieces, x, group=tp.group)
    return torch.cat(pieces, dim=-1)


def broadcast_(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` written into `x` on every rank."""
    tp = get_tp()
    if tp.size > 1:
        import torch.distributed as dist

        dist.broadcast(x, src=0, group=tp.group)
    return x


def min_over_ranks(value: int) -> int:
    tp = get_tp()
    if tp.size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=tp.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.group)
    return int(t.item())
