"""The CPU paged-attention kernel over a bf16 pool (CPUs with AVX512-BF16 take its dpbf16
path, others the portable loops): every query row equals float64 attention over its own
keys for the shapes models have (1-8 query heads a KV head, head dims 64 and 128, blocks
of 8-32 slots, sliding windows, soft-capped scores), and a row's output does not depend
on the batch around it (one row splits its work by KV head, a wide batch by row)."""

from __future__ import annotations

import pytest
import torch

from cadence.ops import cpu_ops

pytestmark = pytest.mark.skipif(
    cpu_ops.ops() is None, reason="the CPU kernels did not build (no C++ compiler here)"
)

# (keys before the query, query tokens): decodes across block edges, and a verify of 3
CASES = [(0, 1), (14, 1), (15, 1), (16, 1), (40, 3), (99, 1), (300, 1)]


def _pool(heads_kv: int, dim: int, block: int, g: torch.Generator):
    blocks = [-(-(c + n) // block) for c, n in CASES]
    perm = torch.randperm(sum(blocks) + 3, generator=g)  # scattered, as a busy pool is
    tables = torch.zeros(len(CASES), max(blocks), dtype=torch.int64)
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[start : start + n]
        start += n
    slots = (sum(blocks) + 3) * block
    k = torch.randn(slots, heads_kv, dim, generator=g).bfloat16()
    v = torch.randn(slots, heads_kv, dim, generator=g).bfloat16()
    return k, v, tables


def _reference(q, k, v, table, block, keys, window, softcap):
    """float64 attention of one query row [Hq, D] over the first `keys` positions."""
    pos = torch.arange(keys)
    lo = max(0, keys - window) if window else 0
    slots = table[pos // block] * block + pos % block
    group = q.shape[0] // k.shape[1]
    kk = k[slots[lo:]].double().repeat_interleave(group, dim=1)  # [keys, Hq, D]
    vv = v[slots[lo:]].double().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,khd->hk", q.double(), kk) * q.shape[-1] ** -0.5
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return torch.einsum("hk,khd->hd", scores.softmax(-1), vv)


def _attend(q, k, v, tables, rows, block, window, softcap):
    ql = torch.tensor([n for _, n in rows])
    first = torch.cat([torch.zeros(1, dtype=torch.int64), ql.cumsum(0)[:-1]])
    out = torch.empty_like(q)
    cpu_ops.ops().paged_attention(
        out, q, k, v, tables, first, ql, torch.tensor([c + n for c, n in rows]), block,
        q.shape[-1] ** -0.5, window, softcap,
    )  # fmt: skip
    return out


@pytest.mark.parametrize(("heads_q", "heads_kv"), [(9, 3), (8, 1), (4, 4), (10, 2)], ids=str)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("block", [16, 8, 32])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (37, 0.0), (0, 30.0)], ids=str)
def test_every_row_equals_float64_attention_and_ignores_its_batch(
    heads_q, heads_kv, dim, block, window, softcap
):
    g = torch.Generator().manual_seed(heads_q * dim + block)
    k, v, tables = _pool(heads_kv, dim, block, g)
    q = torch.randn(sum(n for _, n in CASES), heads_q, dim, generator=g).bfloat16()
    out = _attend(q, k, v, tables, CASES, block, window, softcap)
    row = 0
    for i, (ctx, n) in enumerate(CASES):
        alone = _attend(
            q[row : row + n], k, v, tables[i : i + 1], [(ctx, n)], block, window, softcap
        )
        assert torch.equal(out[row : row + n], alone)
        for t in range(n):
            want = _reference(q[row + t], k, v, tables[i], block, ctx + t + 1, window, softcap)
            torch.testing.assert_close(out[row + t].double(), want, rtol=2e-2, atol=2e-2)
        row += n
