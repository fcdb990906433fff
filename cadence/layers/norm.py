"""RMSNorm, with the residual add fused in (the pattern every decoder layer uses)."""

from __future__ import annotations

import torch
from torch import nn

from cadence.ops import cpu_ops


def _cpu_norm(x, residual, weight, eps, gemma: bool = False):
    """The norm (and the residual add) in one call of the CPU kernel where it can take `x`:
    [T, H] rows, or [T, H, D] per-head q / k norms (Qwen3, Gemma 3: a row per head), in the
    norm's dtype. The result the module's op-by-op forward gives; None elsewhere."""
    if x.dtype != weight.dtype or (ops := cpu_ops.usable(x)) is None:
        return None
    if x.dim() == 2:
        out, summed = ops.add_rms_norm(x, residual, weight, eps, gemma)
        return out if residual is None else (out, summed)
    if x.dim() == 3 and residual is None:
        rows = x.reshape(-1, x.shape[-1])  # (a copy where q is a view of qkv)
        return ops.add_rms_norm(rows, None, weight, eps, gemma)[0].view(x.shape)
    return None


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same op order as transformers' reference, so float32 results match bit for bit.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with a residual: (norm(x + residual), x + residual)."""
        if (
            x.is_cuda
            and (x.dim() == 2 or (x.dim() == 3 and residual is None))
            and x.stride(-1) == 1
        ):
            from cadence.ops import fused  # one Triton kernel instead of ~7 launches

            if residual is None:  # (3-D: per-head q / k norms, Qwen3's)
                return fused.rms_norm(x, self.weight, self.eps)
            return fused.add_rms_norm(x, residual, self.weight, self.eps)
        if (fast := _cpu_norm(x, residual, self.weight, self.eps)) is not None:
            return fast
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the weight is stored as an offset from 1, and the product is taken
    in float32 before the cast back (Llama casts first). Same residual contract."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if (
            x.is_cuda
            and (x.dim() == 2 or (x.dim() == 3 and residual is None))
            and x.stride(-1) == 1
        ):
            from cadence.ops import fused  # one kernel: Gemma 2 runs four norms a layer

            if residual is None:
                return fused.rms_norm(x, self.weight, self.eps, gemma=True)
            return fused.add_rms_norm(x, residual, self.weight, self.eps, gemma=True)
        if (fast := _cpu_norm(x, residual, self.weight, self.eps, gemma=True)) is not None:
            return fast
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def post_norm_add_norm(
    x: torch.Tensor, residual: torch.Tensor, post: nn.Module, pre: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre(post(x) + residual), post(x) + residual): a sandwich layer's (Gemma 2/3) block
    output normed, added to the residual stream, and normed for the next block. One
    Triton launch on CUDA where both norms are RMSNorms of one kind; else the modules."""
    kind = type(post)
    fusable = kind is type(pre) and kind in (RMSNorm, GemmaRMSNorm)
    if fusable and x.is_cuda and x.dim() == 2 and x.stride(-1) == 1:
        from cadence.ops import fused

        gemma = kind is GemmaRMSNorm
        return fused.norm_add_rms_norm(
            x, residual, (post.weight, post.eps), pre.weight, pre.eps, gemma=gemma
        )
    return pre(post(x), residual)


class LayerNorm(nn.LayerNorm):
    """LayerNorm (with or without a bias) under the RMSNorm's residual contract."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(hidden_size, eps=eps, bias=bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return super().forward(x)
        x = x + residual
        return super().forward(x), x


class HeadLayerNorm(nn.Module):
    """A bias-free LayerNorm over each head of q or k, each head with a weight of its own:
    weight [heads, head_dim]; x [T, heads, head_dim]. Statistics and the product in float32,
    one rounding back (Cohere's CohereLayerNorm; StableLM's per-head nn.LayerNorms)."""

    def __init__(self, num_heads: int, head_dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        centred = xf - xf.mean(-1, keepdim=True)
        var = centred.pow(2).mean(-1, keepdim=True)
        return (self.weight.float() * (centred * torch.rsqrt(var + self.eps))).to(x.dtype)
