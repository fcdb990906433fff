"""The CPU attention backend: the torch backend, with short queries (decodes, speculative
verifies) attended straight from the block pool by a C++ kernel.

The torch backend gathers every decoding request's K/V, key by key, into a padded batch for
SDPA: a copy of the whole context per layer per step (12 % of a CPU decode step at 64
requests of 135 tokens, and growing with the context). `cpu_ops.paged_attention` walks each
request's block table instead and reads each key's row where it lies. Prefill chunks (more
than SHORT_QUERY tokens) keep SDPA over gathered K/V: there the copy is amortised over the
chunk's queries, and SDPA's blocked GEMMs beat a per-row kernel. The kernel takes a sliding
window (it reads only the window's blocks) and soft-capped scores; an FP8 cache and
attention sinks fall back to the torch backend's path (the kernel reads the activation
dtype and has no sink term), and so does a step with key limits (Gemma 3's images: the
kernel masks causally).
"""

from __future__ import annotations

import torch

from cadence.attention.torch_ref import TorchAttentionBackend, _Plan
from cadence.ops import cpu_ops


class CpuPagedAttentionBackend(TorchAttentionBackend):
    name = "cpu"  # (the torch backend's capabilities: window and soft-cap, in the kernel too)

    def _plan_short(
        self, plan: _Plan, short: list[tuple[int, int, int, int]], tables, bs: int, device
    ) -> None:
        if plan.key_limits is not None:  # queries that see past themselves: the padded plan
            return super()._plan_short(plan, short, tables, bs, device)
        reqs = torch.tensor(short, dtype=torch.int64)  # (request, first row, query len, keys)
        plan.short_rows = reqs[:, 1].contiguous()
        plan.paged = (
            tables[reqs[:, 0]].contiguous(),
            plan.short_rows,
            reqs[:, 2].contiguous(),
            reqs[:, 3].contiguous(),
            bs,
        )
        plan.short_source = (short, tables, bs, device)  # for the fallback's padded plan

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
        ops = cpu_ops.usable(q)
        plain = isinstance(k_flat, torch.Tensor) and k_flat.dtype == q.dtype
        if ops is None or not plain or sinks is not None or plan.paged is None:
            if plan.short_mask is None:
                super()._plan_short(plan, *plan.short_source)
            super()._attend_short(
                q, k_flat, v_flat, plan, out, scale, num_kv_heads, window, softcap, sinks
            )
            return
        tables, first, qlens, slens, bs = plan.paged
        ops.paged_attention(
            out,
            q,
            k_flat,
            v_flat,
            tables,
            first,
            qlens,
            slens,
            bs,
            scale,
            window or 0,
            softcap or 0.0,
        )
