"""Rotary position embedding (rotate-half layout, as Hugging Face checkpoints store Q/K).

The cos/sin table is computed once for every position up to the model's limit, with the same
float32 ops transformers uses, then indexed by each token's position.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cadence.ops import cpu_ops


def _inv_freq(config, head_dim: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2], attention scale) for the config's rope type (of
    `layer_type`'s entry where the config keeps one per layer type: Gemma 3). default,
    linear and llama3 are computed here, in the float32 ops transformers uses (so the
    tables are bit-identical); other types come from transformers' own functions."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = (
        params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    )
    if rope_type in ("default", "linear", "llama3"):
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if rope_type == "linear":  # positions interpolated: every frequency slowed alike
            return inv / (params or scaling)["factor"], 1.0
        if rope_type == "llama3":
            return _llama3_frequencies(inv, params or scaling), 1.0
        return inv, 1.0
    if rope_type == "dynamic":
        raise ValueError("dynamic NTK rope scaling depends on the sequence length; not supported")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    if layer_type is not None:
        return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", layer_type=layer_type)
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


def _llama3_frequencies(inv: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1's context extension: wavelengths longer than the original context divided
    by low_freq_factor are slowed by `factor`, those shorter than it divided by
    high_freq_factor are kept, and the band between blends the two linearly in
    original_context / wavelength."""
    factor = p["factor"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    context = p["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv
    slowed = torch.where(wavelength > context / low, inv / factor, inv)
    blend = (context / wavelength - low) / (high - low)
    blended = (1 - blend) * slowed / factor + blend * slowed
    between = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(between, blended, slowed)


def _longrope_switch(config, layer_type: str | None) -> int | None:
    """Where a LongRoPE config (Phi-3.5, Phi-3-128k) switches from its short factors to its
    long ones: positions from original_max_position_embeddings on (None: not LongRoPE)."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if kind != "longrope":
        return None
    original = params.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )
    return original or None


class RotaryEmbedding(nn.Module):
    def __init__(
        self, config, head_dim: int, max_position: int, layer_type: str | None = None
    ) -> None:
        """Tables for `head_dim` rotated dims (fewer than a head's under partial rotary).

        LongRoPE: positions before the original context take the short factors, later ones
        the long factors (transformers applies the long ones to a whole sequence once it
        is longer than the original context, re-rotating every cached key; a paged cache
        keeps each key as written, so the table switches by position, as vLLM's does).
        Both carry the same attention scale."""
        super().__init__()
        inv_freq, scale = _inv_freq(config, head_dim, layer_type)
        pos = torch.arange(max_position, dtype=torch.float32)
        # transformers' rope init functions return CPU tensors; the model may be built
        # under `with torch.device("cuda")`.
        freqs = pos[:, None] * inv_freq.float().to(pos.device)[None, :]
        switch = _longrope_switch(config, layer_type)
        if switch is not None and switch < max_position:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            kw = {"layer_type": layer_type} if layer_type is not None else {}
            long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=switch + 1, **kw)
            long = pos[switch:, None] * long_inv.float().to(pos.device)[None, :]
            freqs = torch.cat((freqs[:switch], long))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def lookup(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of shape [T, 1, D] for the step's positions; computed once a step."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(
            dtype
        )


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D]; cos/sin: [T, 1, D]. On CUDA, q and k are rotated
    in place by one Triton kernel (they are views of this layer's fresh qkv output)."""
    cos, sin = cos_sin
    half = q.shape[-1] // 2
    if q.is_cuda and q.stride(-1) == 1 and k.stride(-1) == 1 and half & (half - 1) == 0:
        from cadence.ops import fused

        fused.rotary_(q, k, cos, sin)
        return q, k
    if cos.dtype == q.dtype and (ops := cpu_ops.usable(q)) is not None:
        ops.rotary_(q, k, cos, sin)  # in place, as on CUDA: q, k are views of fresh qkv
        return q, k
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
