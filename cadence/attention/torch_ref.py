"""The reference attention backend in plain PyTorch: any device, the correctness oracle and
the CPU path.

Per step, `build` turns block tables into flat cache-slot indices once, shared by all
layers. Per layer, new K/V are written into their slots first (so a prefix-cache hit on a
block computed in this same step reads what this step wrote), then:

  - requests decoding one token are batched into a single padded SDPA call;
  - prefill chunks run one SDPA call each, over cached prefix + chunk, with a causal mask
    offset by the number of tokens already in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.layers.rotary import apply_rotary


@dataclass
class _Plan:
    # decode group: rows of single-token queries
    decode_rows: torch.Tensor | None  # [Bd] query token index of each
    decode_slots: torch.Tensor | None  # [Bd, Lmax] cache slots (padding -> slot 0)
    decode_mask: torch.Tensor | None  # [Bd, 1, 1, Lmax] True where a real key
    # prefill chunks: (query start, query len, slots of keys [L], causal mask [q, L])
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def build(self, meta: AttentionMetadata) -> AttentionMetadata:
        device = meta.slot_mapping.device
        bs = meta.block_size
        tables = meta.block_tables.cpu()
        decode_rows: list[int] = []
        decode_lens: list[int] = []
        decode_tables: list[int] = []
        prefills = []
        start = 0
        for b, (qlen, slen) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            if qlen == 1:
                decode_rows.append(start)
                decode_lens.append(slen)
                decode_tables.append(b)
            else:
                pos = torch.arange(slen)
                slots = (tables[b, pos // bs] * bs + pos % bs).to(device)
                ctx = slen - qlen
                qpos = torch.arange(ctx, slen)[:, None]
                mask = (pos[None, :] <= qpos).to(device)
                prefills.append((start, qlen, slots, mask))
            start += qlen
        plan = _Plan(None, None, None, prefills)
        if decode_rows:
            lmax = max(decode_lens)
            pos = torch.arange(lmax)
            rows = tables[decode_tables]
            slots = rows[:, pos // bs] * bs + pos % bs
            valid = pos[None, :] < torch.tensor(decode_lens)[:, None]
            plan.decode_rows = torch.tensor(decode_rows, device=device)
            plan.decode_slots = torch.where(valid, slots, 0).to(device)
            plan.decode_mask = valid[:, None, None, :].to(device)
        meta.backend_data = plan
        return meta

    def forward(
        self, q, k, v, kv_cache, meta: AttentionMetadata, scale: float, rotary=None
    ) -> torch.Tensor:
        if rotary is not None:
            q, k = apply_rotary(q, k, rotary)
        num_kv_heads, head_dim = kv_cache.shape[-2:]
        k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
        v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))

        plan: _Plan = meta.backend_data
        out = torch.empty_like(q)
        if plan.decode_rows is not None:
            # GQA as a short query: the G query heads that share a KV head become G query
            # rows of that head, so SDPA runs B * Hkv small problems instead of B * Hq
            # (about 3x faster on CPUs than enable_gqa, and no K/V repeat).
            num_heads = q.shape[1]
            group = num_heads // num_kv_heads
            rows = plan.decode_rows.numel()
            qd = q[plan.decode_rows].view(rows, num_kv_heads, group, head_dim)
            kd = k_flat[plan.decode_slots].transpose(1, 2)  # [Bd, Hkv, L, D]
            vd = v_flat[plan.decode_slots].transpose(1, 2)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=plan.decode_mask, scale=scale)
            out[plan.decode_rows] = od.reshape(rows, num_heads, head_dim)
        for start, qlen, slots, mask in plan.prefills:
            qp = q[start : start + qlen].transpose(0, 1)  # [Hq, q, D]
            kp = k_flat[slots].transpose(0, 1)  # [Hkv, L, D]
            vp = v_flat[slots].transpose(0, 1)
            op = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=mask, scale=scale, enable_gqa=True
            )
            out[start : start + qlen] = op.transpose(0, 1)
        return out
