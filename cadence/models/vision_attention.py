"""Full attention within each of several segments of a packed sequence (an image's
patches, or a window of them), without a Python call per segment: segments of one length
go through one batched SDPA call. A step's images usually share a size (or a few), so a
batch of 64 images is one or a few calls a layer, not 64."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]
) -> torch.Tensor:
    """q, k, v: [N, heads, head_dim] of consecutive segments of `lengths` (summing to N);
    each token attends to every token of its own segment. Returns [N, heads, head_dim]."""
    if len(set(lengths)) == 1:  # one size: a plain batch
        b, s = len(lengths), lengths[0]
        out = F.scaled_dot_product_attention(
            *(t.view(b, s, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        )
        return out.transpose(1, 2).reshape(q.shape)
    out = torch.empty_like(q)
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    by_length: dict[int, list[int]] = {}
    for start, n in zip(starts, lengths):
        by_length.setdefault(n, []).append(start)
    for n, group in by_length.items():
        index = (
            torch.tensor(group, device=q.device)[:, None] + torch.arange(n, device=q.device)
        ).flatten()
        part = segment_attention(q[index], k[index], v[index], [n] * len(group))
        out[index] = part
    return out
