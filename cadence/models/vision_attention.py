"""Full attention within each of several segments of a packed sequence (an image's
patches, or a window of them), without a Python call per segment: segments of one length
go through one batched SDPA call. A step's images usually share a size (or a few), so a
batch of 64 images is one or a few calls a layer, not 64.

The plan (`segment_plan`: which rows make each group of equal segments) is built once per
encode, outside the layers, so the attention itself creates no tensor from host data and
can be captured in a CUDA graph (worker/encoder_graphs.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# (segment length, number of segments, rows of them in order; None: all the rows, in order)
SegmentPlan = list[tuple[int, int, torch.Tensor | None]]


def segment_plan(lengths: list[int], device: torch.device) -> SegmentPlan:
    """The plan of consecutive segments of `lengths` (tokens)."""
    if len(set(lengths)) == 1:  # one size: a plain batch
        return [(lengths[0], len(lengths), None)]
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    by_length: dict[int, list[int]] = {}
    for start, n in zip(starts, lengths):
        by_length.setdefault(n, []).append(start)
    return [
        (n, len(group), (torch.tensor(group)[:, None] + torch.arange(n)).flatten().to(device))
        for n, group in by_length.items()
    ]


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SegmentPlan
) -> torch.Tensor:
    """q, k, v: [N, heads, head_dim] of the plan's segments; each token attends to every
    token of its own segment. Returns [N, heads, head_dim]."""
    if len(plan) == 1 and plan[0][2] is None:
        return _batched(q, k, v, plan[0][0], plan[0][1])
    out = torch.empty_like(q)
    for n, count, index in plan:
        out[index] = _batched(q[index], k[index], v[index], n, count)
    return out


def _batched(q, k, v, length: int, count: int) -> torch.Tensor:
    out = F.scaled_dot_product_attention(
        *(t.view(count, length, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
    )
    return out.transpose(1, 2).reshape(q.shape)
