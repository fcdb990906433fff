"""The torch reference backend: short queries (decodes and speculative verifies, batched
into one padded call) and long prefill chunks (one call each) both equal plain causal
attention over each request's cached prefix and query, with grouped KV heads, a sliding
window, soft-capped scores, attention sinks and key limits (queries that see later keys);
so does the CPU backend's paged kernel (or its fallback)."""

from __future__ import annotations

import pytest
import torch

from cadence.attention.base import AttentionMetadata
from cadence.attention.cpu_paged import CpuPagedAttentionBackend
from cadence.attention.torch_ref import SHORT_QUERY, TorchAttentionBackend
from cadence.ops import cpu_ops

BS, HQ, HKV, D = 4, 4, 2, 8
# (block size, head dim): the small default, and the head dims the CPU kernel's
# register-blocked loops take (eight keys a step: blocks of 16 keys)
SHAPES = [(BS, D), (16, 64), (16, 128)]


def reference(q, keys, values, ctx, window=None, softcap=None, sinks=None, limits=None):
    """Causal attention of q [n, Hq, D] at positions ctx.. over keys [ctx + n, Hkv, D]; a
    query at p sees keys j with p - window < j <= p (or <= limits[i], query i's last key);
    scores capped at softcap * tanh; head h's softmax sum gains e^sinks[h] (a logit whose
    value is zero)."""
    k = keys.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
    v = values.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
    n, total = q.shape[0], keys.shape[0]
    qpos = (ctx + torch.arange(n))[:, None]
    last = qpos if limits is None else limits[:, None]
    mask = torch.arange(total)[None, :] <= last
    if window is not None:
        mask &= torch.arange(total)[None, :] > qpos - window
    scores = (q.transpose(0, 1) @ k.transpose(1, 2)) * q.shape[-1] ** -0.5
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks[:, None, None].expand(-1, n, 1)
        probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return (probs @ v).transpose(0, 1)


def _backend(name: str):
    if name == "torch":
        return TorchAttentionBackend()
    if cpu_ops.ops() is None:
        pytest.skip("the CPU kernels did not build on this machine (no C++ compiler)")
    return CpuPagedAttentionBackend()


# "cpu": the same plan, short queries read straight from the block pool by the C++ kernel.
@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "head_dim"), SHAPES, ids=str)
@pytest.mark.parametrize(
    ("window", "softcap", "with_sinks", "with_limits"),
    [
        (None, None, False, False),
        (5, None, False, False),
        (None, 0.5, False, False),
        (6, 0.5, False, False),
        (5, None, True, False),
        (None, None, False, True),
        (5, 0.5, False, True),
    ],
    ids=str,
)
def test_short_and_long_queries_equal_plain_attention(
    backend_name, dtype, block_size, head_dim, window, softcap, with_sinks, with_limits
):
    BS, D = block_size, head_dim  # noqa: N806 (the module's names, for this shape)
    g = torch.Generator().manual_seed(0)
    # sink logits around the scores' own size, so they take a real share of each row
    sinks = torch.randn(HQ, generator=g) * 2 if with_sinks else None
    qlens = [1, 3, SHORT_QUERY, SHORT_QUERY + 1, 5, 1]
    ctxs = [7, 0, 12, 3, 70, 1]
    num_blocks = 64
    cache = torch.zeros(2, num_blocks, BS, HKV, D)
    perm = torch.randperm(num_blocks - 1, generator=g) + 1
    tables, next_block, slots, kv_per_req = [], 0, [], []
    for qlen, ctx in zip(qlens, ctxs):
        n = -(-(ctx + qlen) // BS)
        tables.append(perm[next_block : next_block + n])
        next_block += n
        keys = torch.randn(ctx + qlen, HKV, D, generator=g)
        values = torch.randn(ctx + qlen, HKV, D, generator=g)
        kv_per_req.append((keys, values))
        pos = torch.arange(ctx + qlen)
        flat = tables[-1][pos // BS] * BS + pos % BS
        cache[0].view(-1, HKV, D)[flat[:ctx]] = keys[:ctx]  # the cached prefix
        cache[1].view(-1, HKV, D)[flat[:ctx]] = values[:ctx]
        slots.append(flat[ctx:])
    width = max(len(t) for t in tables)
    table = torch.zeros(len(qlens), width, dtype=torch.int64)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    q = torch.randn(sum(qlens), HQ, D, generator=g)
    k = torch.cat([kv[0][ctx:] for kv, ctx in zip(kv_per_req, ctxs)])
    v = torch.cat([kv[1][ctx:] for kv, ctx in zip(kv_per_req, ctxs)])
    seq_lens = [c + n for c, n in zip(ctxs, qlens)]
    meta = AttentionMetadata(
        num_tokens=sum(qlens),
        query_start_loc=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()]),
        seq_lens=torch.tensor(seq_lens),
        slot_mapping=torch.cat(slots),
        block_tables=table,
        query_lens_cpu=qlens,
        seq_lens_cpu=seq_lens,
        block_size=BS,
    )
    # Key limits: spans of positions that see each other both ways (an image of Gemma 3's),
    # in short and long queries, one begun in the cached prefix; the others causal.
    positions = torch.cat([torch.arange(c, c + n) for c, n in zip(ctxs, qlens)])
    limits = positions.clone()
    if with_limits:
        starts = torch.tensor([0, *qlens]).cumsum(0)
        for req, lo, hi in [(1, 0, 3), (2, 14, 22), (3, 1, 12), (4, 71, 75)]:
            rows = starts[req] + torch.arange(max(lo, ctxs[req]), hi) - ctxs[req]
            limits[rows] = hi - 1
        meta.key_limits_cpu, meta.key_limits = limits, limits.int()
    backend = _backend(backend_name)
    cache, q, k, v = cache.to(dtype), q.to(dtype), k.to(dtype), v.to(dtype)
    meta = backend.build(meta)
    out = backend.forward(
        q, k, v, cache, meta, D**-0.5, window=window, softcap=softcap, sinks=sinks
    )
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    start = 0
    for (keys, values), qlen, ctx in zip(kv_per_req, qlens, ctxs):
        keys, values = keys.to(dtype).float(), values.to(dtype).float()
        want = reference(
            q[start : start + qlen].float(),
            keys,
            values,
            ctx,
            window,
            softcap,
            sinks,
            limits[start : start + qlen],
        )
        torch.testing.assert_close(out[start : start + qlen].float(), want, rtol=tol, atol=tol)
        start += qlen
