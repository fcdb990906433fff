"""Self-attention as every family uses it, its differences held as data (`AttentionOptions`).

    qkv_bias / o_bias   biases on the fused q/k/v projection and on o_proj
    qk_norm             "head": an RMSNorm over each head of q and k (Qwen3, Gemma 3);
                        "full": one over all of q and all of k, before the heads split (OLMo 2);
                        "per_head": a LayerNorm over each head with a weight of its own
                        (Cohere's use_qk_norm, StableLM's qk_layernorm)
    norm                the RMSNorm kind qk_norm uses (Gemma's scales by 1 + w)
    scale               the score scale (head_dim ** -0.5 unless a family says otherwise)
    rotary_dim          how many leading dims of each head rotate (partial rotary: StableLM);
                        0: none (SmolLM3's no-rope layers)
    rotary_kind         which of the model's rotary tables this layer reads ("global" unless
                        the family keeps a local one: Gemma 3)
    rotary_interleaved  pairs (0, 1), (2, 3), ... rotate together (GPT-J style: Cohere,
                        GLM-4), not the two halves of the head
    window              sliding window W: a query sees its last W keys (None: all of them)
    softcap             c: scores become c * tanh(score / c) (Gemma 2)
    sinks               a learned logit per head joins each softmax's sum (GPT-OSS): the
                        `sinks` parameter, float32, this rank's heads

The backend does the rest; a layer asks only for what its backend declares it can do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.distributed.communication import all_reduce
from cadence.distributed.parallel_state import get_tp
from cadence.layers.linear import ColumnParallelLinear, ColumnShard, RowParallelLinear, divide
from cadence.layers.norm import GemmaRMSNorm, HeadLayerNorm, RMSNorm
from cadence.layers.rotary import apply_rotary
from cadence.models.fused import batch1_gemv
from cadence.quant.base import shape_of

# Whether per-head q / k norms go to a backend that can apply them (CADENCE_BACKEND_HEAD_NORMS=0:
# the model's own norm launches, to measure one against the other).
BACKEND_HEAD_NORMS = os.environ.get("CADENCE_BACKEND_HEAD_NORMS", "1") != "0"


@dataclass(frozen=True)
class AttentionOptions:
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str | None = None  # None | "head" | "full" | "per_head"
    norm: type[nn.Module] = RMSNorm
    scale: float | None = None  # None: head_dim ** -0.5
    rotary_dim: int | None = None  # None: the whole head
    rotary_kind: str = "global"
    rotary_interleaved: bool = False
    window: int | None = None
    softcap: float | None = None
    sinks: bool = False


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    def __init__(self, config, backend: AttentionBackend, options: AttentionOptions) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = head_dim_of(config)
        # This rank's heads (all of them with one rank).
        self.num_heads = divide(total_heads, get_tp().size, "the number of attention heads")
        q_shard = ColumnShard.split(total_heads * self.head_dim, "the number of attention heads")
        kv_shard = ColumnShard.for_kv_heads(total_kv_heads, self.head_dim)
        self.num_kv_heads = kv_shard.count // self.head_dim
        self.q_size = q_shard.count
        self.kv_size = kv_shard.count
        self.scale = options.scale if options.scale is not None else self.head_dim**-0.5
        self.rotary_dim = self.head_dim if options.rotary_dim is None else options.rotary_dim
        self.rotary_kind = options.rotary_kind
        self.rotary_interleaved = options.rotary_interleaved
        self.window = options.window
        self.softcap = options.softcap
        _check_backend(backend, options)
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [q_shard, kv_shard, kv_shard], bias=options.qkv_bias
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim,
            config.hidden_size,
            bias=options.o_bias,
            what="the number of attention heads",
        )
        eps = getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", 1e-6)
        if options.qk_norm in ("full", "per_head") and get_tp().size > 1:
            raise ValueError("these q/k norms need every head's weights on one rank")
        self.qk_norm = options.qk_norm
        self.q_norm = self.k_norm = None
        if options.qk_norm == "per_head":
            self.q_norm = HeadLayerNorm(self.num_heads, self.head_dim, eps)
            self.k_norm = HeadLayerNorm(self.num_kv_heads, self.head_dim, eps)
        elif options.qk_norm is not None:
            q_dim, k_dim = {
                "head": (self.head_dim, self.head_dim),
                "full": (self.q_size, self.kv_size),
            }[options.qk_norm]
            self.q_norm, self.k_norm = options.norm(q_dim, eps), options.norm(k_dim, eps)
        # Per-head RMSNorms the backend can apply itself, in the launch that rotates q and
        # k (before rotary, which it must then do too: not interleaved, not partial).
        self.backend_norms = (
            BACKEND_HEAD_NORMS
            and options.qk_norm == "head"
            and backend.capabilities.head_norm
            and options.norm in (RMSNorm, GemmaRMSNorm)
            and not self.rotary_interleaved
            and self.rotary_dim in (0, self.head_dim)
        )
        self.sinks = None
        if options.sinks:  # (zeros until loaded: what dummy weights keep)
            self.sinks = nn.Parameter(torch.zeros(self.num_heads, dtype=torch.float32))
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner
        self.kv_group = 0  # which KV group's blocks it reads (set where it is bound)
        # An FP8 cache stores k / k_scale and v / v_scale: the checkpoint's scales where it
        # has them, else 1.0. Plain floats: they are constant once loaded (and a CUDA
        # graph keeps kernel arguments by value).
        self.kv_scale: tuple[float, float] = (1.0, 1.0)

    def forward(self, cos_sin, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention from the projected qkv [T, (Hq + 2 Hkv) * D] to o_proj's output.
        `cos_sin`: the model's rotary tables for this step, by kind."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        norms = {}
        if self.backend_norms:
            qn, kn = self.q_norm, self.k_norm
            gemma = type(qn) is GemmaRMSNorm
            norms = {"head_norm": (qn.weight, kn.weight, qn.eps, gemma)}
        elif self.qk_norm in ("head", "per_head"):
            q, k = self.q_norm(q), self.k_norm(k)
        rotary = cos_sin[self.rotary_kind] if self.rotary_dim else None
        if rotary is not None and self.rotary_interleaved:
            q, k = rotate_interleaved(q, k, rotary, self.rotary_dim)
            rotary = None
        elif rotary is not None and self.rotary_dim < self.head_dim:
            q, k = _rotate_leading(q, k, rotary, self.rotary_dim)
            rotary = None
        if self.kv_group and meta.groups is not None:  # (a warm-up step has one group)
            meta = meta.groups[self.kv_group]
        # The backend rotates q and k (the Triton one while it writes K/V to the cache).
        out = self.backend.forward(
            q,
            k,
            v,
            self.kv_cache,
            meta,
            self.scale,
            rotary,
            self.kv_scale,
            window=self.window,
            softcap=self.softcap,
            sinks=self.sinks,
            **norms,
        )
        out = out.reshape(-1, self.q_size)
        o = self.o_proj
        if (gemv := batch1_gemv(out, o, "o")) is not None:
            return all_reduce(gemv.gemv(out, o.weight, o.local_bias))
        return o(out)

    def load(self, kind: str, source, shard: int = 0) -> None:
        """A checkpoint's `sinks` [total heads]: this rank's heads of it."""
        if kind != "sinks" or self.sinks is None:
            raise ValueError(f"unexpected attention weight {kind!r}")
        tp = get_tp()
        if shape_of(source) != (self.num_heads * tp.size,):
            raise ValueError(f"sinks: checkpoint shape {shape_of(source)} does not fit")
        first = tp.rank * self.num_heads
        self.sinks.data.copy_(source[first : first + self.num_heads])


def _check_backend(backend: AttentionBackend, options: AttentionOptions) -> None:
    caps = backend.capabilities
    for needed, has, what in (
        (options.window is not None, caps.sliding_window, "sliding-window attention"),
        (options.softcap is not None, caps.softcap, "soft-capped attention scores"),
        (options.sinks, caps.sinks, "attention sinks"),
    ):
        if needed and not has:
            raise ValueError(
                f"this model needs {what}, which the {backend.name} attention backend "
                "does not do yet (the torch, cpu and triton backends do)"
            )


def _rotate_leading(q, k, cos_sin, dims: int):
    """Partial rotary: rotate the first `dims` of each head (cos/sin tables of `dims`)."""
    qr, qp = q[..., :dims], q[..., dims:]
    kr, kp = k[..., :dims], k[..., dims:]
    qr, kr = apply_rotary(qr.contiguous(), kr.contiguous(), cos_sin)
    return torch.cat((qr, qp), dim=-1), torch.cat((kr, kp), dim=-1)


def rotate_interleaved(q, k, cos_sin, dims: int):
    """GPT-J-style rotary over the first `dims` of each head: element pairs (2i, 2i + 1)
    rotate by frequency i. The tables hold [f0 .. f(dims/2-1), f0 ..]: each frequency is
    repeated in place for the pairs."""
    cos, sin = (t[..., : dims // 2].repeat_interleave(2, dim=-1) for t in cos_sin)

    def rotate(x):
        xr = x[..., :dims]
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
        return torch.cat((xr * cos + turned * sin, x[..., dims:]), dim=-1)

    return rotate(q), rotate(k)
