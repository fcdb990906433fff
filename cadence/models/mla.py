"""Multi-head latent attention (DeepSeek-V2/V3): every head's keys and values come from one
shared latent per token, and the KV pool stores that latent, not the heads' K and V.

Per token the layer projects the hidden state to

    c_kv   [C]  the compressed latent (kv_lora_rank, 512 in DeepSeek's), RMS-normed
    k_rope [R]  one rotated key part shared by every head (qk_rope_head_dim, 64)

and each head h's key is (W_UK[h] c_kv, k_rope), its value W_UV[h] c_kv, where W_UK [nope, C]
and W_UV [v, C] are head h's rows of kv_b_proj. The scores factor:

    q_h . k_h = (W_UK[h]^T q_nope_h) . c_kv + q_rope_h . k_rope

so the projections are absorbed: q becomes (W_UK[h]^T q_nope_h, q_rope_h) [C + R] and every
head attends to the same one-head key (c_kv, k_rope) [C + R], the latent itself. That is
multi-query attention with a C + R wide head over a cache of C + R values per token (576 in
DeepSeek's, against 2 x 128 heads x 192 expanded: 85x less). The value is the latent too:
the attention output's first C dims, lifted by W_UV[h] per head before o_proj.

The cache: one [1, num_blocks, block_size, 1, C + R] tensor per layer, bound to the layer
as a [2, ...] view whose K and V halves are the same memory (`kv_shared`; see
worker/kv_tensors.py), so every backend reads and writes it as a one-head K/V cache with
no case of its own. (Writing K and V writes the latent twice into one place.)

Under tensor parallelism each rank holds its share of the heads (q, kv_b_proj, o_proj)
and the whole latent (replicated: every head reads all of it).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.distributed.parallel_state import get_tp
from cadence.layers.linear import ColumnParallelLinear, ColumnShard, RowParallelLinear, divide
from cadence.layers.norm import RMSNorm
from cadence.layers.rotary import apply_rotary
from cadence.models.attention import rotate_interleaved
from cadence.quant.base import shape_of


def latent_kv_dim(config) -> int | None:
    """Width of the cached latent per token (kv_lora_rank + qk_rope_head_dim) for a
    multi-head latent attention config; None for any other."""
    rank = getattr(config, "kv_lora_rank", None)
    if not rank:
        return None
    return rank + config.qk_rope_head_dim


def latent_scale(config) -> float:
    """The score scale: (qk_nope + qk_rope) ** -0.5, times YaRN's mscale(factor,
    mscale_all_dim) squared where the rope is scaled (DeepSeek's long-context configs)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = params or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    all_dim = params.get("mscale_all_dim", 0)
    factor = params.get("factor", 1.0)
    if kind != "default" and all_dim and factor > 1:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class LatentUpProjection(nn.Module):
    """kv_b_proj [heads x (nope + v), C], this rank's heads: per head, nope rows that lift
    the latent to the head's un-rotated key (W_UK) and v rows to its value (W_UV). Kept
    in the activation dtype (never quantized): it is absorbed, not applied as a Linear."""

    def __init__(self, total_heads: int, nope: int, v: int, latent: int) -> None:
        super().__init__()
        tp = get_tp()
        self.num_heads = divide(total_heads, tp.size, "the number of attention heads")
        self.nope, self.v, self.latent = nope, v, latent
        self.weight = nn.Parameter(torch.empty(self.num_heads * (nope + v), latent))

    def load(self, kind: str, source, shard: int = 0) -> None:
        rows = self.num_heads * (self.nope + self.v)
        full = (rows * get_tp().size, self.latent)
        if kind != "weight" or shape_of(source) != full:
            raise ValueError(f"kv_b_proj {kind}: checkpoint shape {shape_of(source)} != {full}")
        first = get_tp().rank * rows
        self.weight.data.copy_(source[first : first + rows])

    def absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, nope, C], W_UV [heads, v, C]), views of the weight."""
        w = self.weight.view(self.num_heads, self.nope + self.v, self.latent)
        return w[:, : self.nope], w[:, self.nope :]


class LatentAttention(nn.Module):
    """The attention block of a DeepSeek-V2/V3 layer. `qkv_proj` holds the projections of
    the normed hidden state, fused: q (or q_a, the query's own low-rank compression, with
    q_lora_rank) and kv_a (c_kv and k_rope). `interleaved`: the rope dims rotate in pairs
    (2i, 2i + 1), as DeepSeek's checkpoints lay them out."""

    kv_shared = True  # the cache's K and V are one latent tensor (worker/kv_tensors.py)
    window = None  # (every latent layer sees the whole context)

    def __init__(self, config, backend: AttentionBackend, interleaved: bool) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        self.num_heads = divide(total_heads, get_tp().size, "the number of attention heads")
        self.nope_dim = config.qk_nope_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.latent_dim = config.kv_lora_rank
        self.num_kv_heads = 1
        self.head_dim = self.latent_dim + self.rope_dim  # of the cache's one head
        self.scale = latent_scale(config)
        self.interleaved = interleaved
        q_head = self.nope_dim + self.rope_dim
        q_lora = getattr(config, "q_lora_rank", None)
        bias = bool(getattr(config, "attention_bias", False))
        if bias and not q_lora:  # (q_proj has none, kv_a_proj_with_mqa one: no release does)
            raise ValueError("latent attention with attention_bias needs a q_lora_rank")
        eps = config.rms_norm_eps
        # q (by heads) or q_a (whole on every rank), then kv_a (whole on every rank)
        q_shard = (
            ColumnShard(q_lora, 0, q_lora)
            if q_lora
            else ColumnShard.split(total_heads * q_head, "the number of attention heads")
        )
        self.q_width = q_shard.count
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [q_shard, ColumnShard(self.head_dim, 0, self.head_dim)], bias
        )
        self.q_a_layernorm = self.q_b_proj = None
        if q_lora:
            self.q_a_layernorm = RMSNorm(q_lora, eps)
            self.q_b_proj = ColumnParallelLinear(
                q_lora,
                [ColumnShard.split(total_heads * q_head, "the number of attention heads")],
                bias=False,
            )
        self.kv_a_layernorm = RMSNorm(self.latent_dim, eps)
        self.kv_b_proj = LatentUpProjection(total_heads, self.nope_dim, self.v_dim, self.latent_dim)
        self.o_proj = RowParallelLinear(
            total_heads * self.v_dim, config.hidden_size, bias, "the number of attention heads"
        )
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner
        self.kv_group = 0

    @property
    def kv_scale(self) -> tuple[float, float]:
        """An FP8 cache stores the latent unscaled (it has no K/V scales of its own)."""
        return (1.0, 1.0)

    @kv_scale.setter
    def kv_scale(self, value: tuple[float, float]) -> None:
        if tuple(value) != (1.0, 1.0):  # (the loader sets a checkpoint's k_scale / v_scale)
            raise ValueError("KV-cache scales for a latent (MLA) cache are not supported")

    def forward(self, cos_sin, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention from the fused projection [T, q_width + C + R] to o_proj's output."""
        q, kv_a = qkv.split([self.q_width, self.head_dim], dim=-1)
        if self.q_b_proj is not None:
            q = self.q_b_proj(self.q_a_layernorm(q))
        q = q.view(-1, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_rope = kv_a.split([self.latent_dim, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv.contiguous())
        q_rope, k_rope = self._rotate(q_rope, k_rope[:, None, :], cos_sin["global"])
        w_uk, w_uv = self.kv_b_proj.absorbed()
        # q_lat[t, h] = W_UK[h]^T q_nope[t, h]: one batched GEMM over the heads
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, C]
        query = torch.cat((q_lat, q_rope.to(q_lat.dtype)), dim=-1)
        latent = torch.cat((c_kv, k_rope[:, 0].to(c_kv.dtype)), dim=-1)[:, None, :]
        if self.kv_group and meta.groups is not None:
            meta = meta.groups[self.kv_group]
        out = self.backend.forward_latent(
            query, latent, self.kv_cache, meta, self.scale, self.latent_dim
        )
        # each head's value: W_UV[h] times the attention-weighted latent
        o_lat = out.transpose(0, 1)  # [H, T, C]
        heads = torch.bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        return self.o_proj(heads.reshape(-1, self.num_heads * self.v_dim))

    def _rotate(self, q_rope, k_rope, cos_sin):
        if self.interleaved:
            return rotate_interleaved(q_rope, k_rope, cos_sin, self.rope_dim)
        return apply_rotary(q_rope.contiguous(), k_rope.contiguous(), cos_sin)
