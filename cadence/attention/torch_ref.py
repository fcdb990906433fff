"""The reference attention backend in plain PyTorch: any device, the correctness oracle and
the CPU path.

Per step, `build` turns block tables into flat cache-slot indices once, shared by all
layers. Per layer, new K/V are written into their slots first (so a prefix-cache hit on a
block computed in this same step reads what this step wrote), then:

  - requests with a short query (decoding one token, or verifying a few draft tokens:
    up to SHORT_QUERY tokens) are batched into a single padded SDPA call;
  - longer prefill chunks run one SDPA call each, over cached prefix + chunk, with a
    causal mask offset by the number of tokens already in the cache.

Key limits (an image whose tokens attend to each other both ways, Gemma 3) move a query's
last visible key past its own position: the masks are built from them instead.

A sliding-window layer narrows the causal mask to the last W keys (each window's masks are
built once a step, on first use); a soft-capped layer (Gemma 2) or one with attention
sinks (GPT-OSS) scores in plain matmuls, since SDPA has no hook between the scores and
the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cadence.attention.base import (
    FP8_KV_DTYPE,
    FP8_MAX,
    AttentionBackend,
    AttentionMetadata,
    BackendCapabilities,
    is_fp8,
)
from cadence.layers.rotary import apply_rotary

# Queries up to this many tokens join the batched call (decodes, speculative verifies).
SHORT_QUERY = 16


@dataclass
class _Plan:
    # short queries, padded to Q tokens each: B requests
    short_rows: torch.Tensor | None  # [B * Q] query token index of each row (padding: any)
    short_real: torch.Tensor | None  # [B * Q] bool: a real query token (not padding)
    short_slots: torch.Tensor | None  # [B, Lmax] cache slots of keys (padding -> slot 0)
    short_mask: torch.Tensor | None  # [B, 1, Q, Lmax] True where the query sees the key
    # prefill chunks: (query start, query len, slots of keys [L], causal mask [q, L])
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]]
    # (query positions, key positions) behind each mask, for windowed ones: of the short
    # batch ([B, 1, Q, 1], [Lmax]) and of each prefill chunk ([q, 1], [L]).
    short_positions: tuple[torch.Tensor, torch.Tensor] | None = None
    prefill_positions: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    windowed: dict = field(default_factory=dict)  # (which mask, W) -> its windowed mask
    # The CPU backend's short queries: (block tables [B, W], first rows, query lens, keys,
    # block size), all int64 on the CPU, and what the torch path's padded plan is built from.
    paged: tuple | None = None
    short_source: tuple | None = None
    key_limits: torch.Tensor | None = None  # [T] int64 on the host (meta.key_limits_cpu)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    capabilities = BackendCapabilities(
        sliding_window=True, softcap=True, sinks=True, key_limits=True
    )

    def build(self, meta: AttentionMetadata) -> AttentionMetadata:
        device = meta.slot_mapping.device
        bs = meta.block_size
        tables = meta.block_tables.cpu()
        limits = meta.key_limits_cpu  # (None: causal)
        short: list[tuple[int, int, int, int]] = []  # (request, first row, query len, keys)
        prefills = []
        positions: list[tuple[torch.Tensor, torch.Tensor]] = []
        start = 0
        for b, (qlen, slen) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            if qlen <= SHORT_QUERY:
                short.append((b, start, qlen, slen))
            else:
                pos = torch.arange(slen)
                slots = (tables[b, pos // bs] * bs + pos % bs).to(device)
                ctx = slen - qlen
                qpos = torch.arange(ctx, slen)[:, None]
                last = qpos if limits is None else limits[start : start + qlen, None]
                mask = (pos[None, :] <= last).to(device)
                prefills.append((start, qlen, slots, mask))
                positions.append((qpos.to(device), pos.to(device)))
            start += qlen
        plan = _Plan(None, None, None, None, prefills, prefill_positions=positions)
        plan.key_limits = limits
        if short:
            self._plan_short(plan, short, tables, bs, device)
        meta.backend_data = plan
        return meta

    def _plan_short(
        self, plan: _Plan, short: list[tuple[int, int, int, int]], tables, bs: int, device
    ) -> None:
        """Pad the short queries (request, first row, query len, keys) into one batch."""
        reqs = torch.tensor(short)
        first, qlens, slens = reqs[:, 1], reqs[:, 2], reqs[:, 3]
        qmax, lmax = int(qlens.max()), int(slens.max())
        i = torch.arange(qmax)
        real = i[None, :] < qlens[:, None]  # [B, Q]
        rows = torch.where(real, first[:, None] + i, first[:, None])
        pos = torch.arange(lmax)
        slots = tables[reqs[:, 0]][:, pos // bs] * bs + pos % bs
        valid = pos[None, :] < slens[:, None]  # [B, L]
        # Query i of a request sits at position (keys - query len + i): causal, unless
        # the step's key limits let it see further.
        qpos = (slens - qlens)[:, None] + i  # [B, Q]
        last = qpos if plan.key_limits is None else torch.where(real, plan.key_limits[rows], qpos)
        mask = valid[:, None, :] & (pos[None, None, :] <= last[:, :, None])
        mask[:, :, 0] |= ~real  # a padding row sees key 0: no row is all -inf (NaN)
        plan.short_rows = rows.flatten().to(device)
        plan.short_real = real.flatten().to(device)
        plan.short_slots = torch.where(valid, slots, 0).to(device)
        plan.short_mask = mask[:, None].to(device)
        plan.short_positions = (qpos[:, None, :, None].to(device), pos.to(device))

    def forward(
        self,
        q,
        k,
        v,
        kv_cache,
        meta: AttentionMetadata,
        scale: float,
        rotary=None,
        kv_scale: tuple[float, float] = (1.0, 1.0),
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if rotary is not None:
            q, k = apply_rotary(q, k, rotary)
        num_kv_heads, head_dim = kv_cache.shape[-2:]
        if is_fp8(kv_cache.dtype):
            # Stored scaled and saturated; read back widened and rescaled. (CPU torch has
            # no index ops for float8: they run on the bytes.)
            k_flat, v_flat = _Fp8Rows(kv_cache[0], kv_scale[0]), _Fp8Rows(kv_cache[1], kv_scale[1])
            k_flat.write(meta.slot_mapping, k)
            v_flat.write(meta.slot_mapping, v)
        else:
            k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
            v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
            k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
            v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))

        plan: _Plan = meta.backend_data
        out = torch.empty_like(q)
        if plan.short_rows is not None:
            self._attend_short(
                q, k_flat, v_flat, plan, out, scale, num_kv_heads, window, softcap, sinks
            )
        for i, (start, qlen, slots, mask) in enumerate(plan.prefills):
            if window is not None:
                mask = _windowed(plan, ("prefill", i), mask, plan.prefill_positions[i], window)
            # 4-D [1, H, L, D]: PyTorch's CPU flash kernel takes only 4-D inputs; 3-D ones
            # fall to the unfused math path (2.4x slower at 512 tokens, 1.4x at 128).
            qp = q[start : start + qlen].transpose(0, 1)[None]  # [1, Hq, q, D]
            kp = k_flat[slots].to(q.dtype).transpose(0, 1)[None]  # [1, Hkv, L, D]
            vp = v_flat[slots].to(q.dtype).transpose(0, 1)[None]
            row_sinks = None if sinks is None else sinks[None, :, None, None]  # [1, Hq, 1, 1]
            op = _attend(qp, kp, vp, mask, scale, softcap, row_sinks)
            out[start : start + qlen] = op[0].transpose(0, 1)
        return out

    def _attend_short(
        self,
        q,
        k_flat,
        v_flat,
        plan: _Plan,
        out: torch.Tensor,
        scale: float,
        num_kv_heads: int,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Attention of the short queries into their rows of `out` (K/V gathered by slot
        into a padded batch, one SDPA call)."""
        head_dim = q.shape[-1]
        # GQA as a longer query: the G query heads that share a KV head become G query
        # rows of that head (per query token), so SDPA runs B * Hkv small problems
        # instead of B * Hq (about 3x faster on CPUs than enable_gqa, no K/V repeat).
        num_heads = q.shape[1]
        group = num_heads // num_kv_heads
        b, qmax = plan.short_mask.shape[0], plan.short_mask.shape[2]
        qs = q[plan.short_rows].view(b, qmax, num_kv_heads, group, head_dim)
        qs = qs.transpose(1, 2).reshape(b, num_kv_heads, qmax * group, head_dim)
        ks = k_flat[plan.short_slots].to(q.dtype).transpose(1, 2)  # [B, Hkv, L, D]
        vs = v_flat[plan.short_slots].to(q.dtype).transpose(1, 2)
        mask = plan.short_mask
        if window is not None:
            mask = _windowed(plan, ("short",), mask, plan.short_positions, window)
        if qmax > 1:  # each query token's mask row, once per head of its group
            mask = mask.repeat_interleave(group, dim=2)
        row_sinks = None
        if sinks is not None:  # row i * G + g of KV head h is query head h * G + g
            row_sinks = sinks.view(num_kv_heads, 1, group).expand(-1, qmax, -1)
            row_sinks = row_sinks.reshape(1, num_kv_heads, qmax * group, 1)
        os_ = _attend(qs, ks, vs, mask, scale, softcap, row_sinks)
        os_ = os_.view(b, num_kv_heads, qmax, group, head_dim).transpose(1, 2)
        os_ = os_.reshape(b * qmax, num_heads, head_dim)
        if qmax == 1:
            out[plan.short_rows] = os_
        else:
            out[plan.short_rows[plan.short_real]] = os_[plan.short_real]


def _windowed(plan: _Plan, which: tuple, mask, positions, window: int) -> torch.Tensor:
    """`mask` narrowed to the last `window` keys of each query (built once a step)."""
    key = (*which, window)
    if key not in plan.windowed:
        qpos, kpos = positions
        narrowed = mask & (kpos > qpos - window)
        # A real query always sees itself; a padding row may now see nothing: key 0 then
        # (an all -inf row would be NaN).
        narrowed[..., 0] |= ~narrowed.any(-1)
        plan.windowed[key] = narrowed
    return plan.windowed[key]


def _attend(q, k, v, mask, scale: float, softcap: float | None, sinks=None) -> torch.Tensor:
    """softmax(q k^T * scale [soft-capped], masked) v over [N, H, q, D] inputs; k, v may
    have fewer heads (grouped-query). SDPA unless the scores are soft-capped or a row's
    softmax has a sink (`sinks`: float32 logits broadcast to [N, H, q, 1]): then the same
    steps in transformers' order (scale, cap, mask, sink column, float32 softmax)."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    if q.shape[1] != k.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:  # the sink takes its share of each row's sum, then is dropped
        sink = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1, dtype=torch.float32)
        weights = weights[..., :-1]
    return torch.matmul(weights.to(q.dtype), v)


class _Fp8Rows:
    """One half (K or V) of an FP8 cache as slots: write scales and saturates, indexing
    returns the rows widened to float32 and rescaled."""

    def __init__(self, cache: torch.Tensor, scale: float) -> None:
        self.bytes = cache.reshape(-1, *cache.shape[-2:]).view(torch.uint8)
        self.scale = scale

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        q = (x.float() / self.scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)
        self.bytes.index_copy_(0, slots, q.view(torch.uint8))

    def __getitem__(self, slots: torch.Tensor) -> torch.Tensor:
        return self.bytes[slots].view(FP8_KV_DTYPE).float() * self.scale
