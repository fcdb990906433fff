"""The batch-1 fused paths the decoder blocks share: on CUDA, a single decode row of 16-bit
activations through a plain weight takes cadence.ops.gemv's fused kernels (norm + GEMV,
SiLU-mul + GEMV, norm + a mixture's router) instead of a separate kernel per op."""

from __future__ import annotations

import torch
from torch import nn

from cadence.layers.linear import ColumnParallelLinear
from cadence.layers.norm import RMSNorm


def batch1_gemv(x: torch.Tensor, linear: nn.Module, projection: str):
    """cadence.ops.gemv when this projection takes its fused Triton kernels: a single
    row (batch-1 decode) of 16-bit activations on CUDA, a plain weight of their dtype (not
    a quantized one), and a projection in its FUSED_PROJECTIONS. None otherwise (the
    layer's own matmul and the separate elementwise kernels)."""
    if x.shape[0] != 1 or not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    weight = linear.quant_method.plain_weight(linear)
    if (
        weight is None
        or weight.dtype != x.dtype
        or not (weight.is_contiguous() and x.is_contiguous())
    ):
        return None
    from cadence.ops import gemv

    return gemv if projection in gemv.FUSED_PROJECTIONS else None


def norm_linear(x, residual, norm: nn.Module, linear: ColumnParallelLinear, projection: str):
    """(linear(norm(x + residual)), x + residual); the first layer has no residual yet
    (then it is x). One kernel at batch 1 where the fused gemv serves (a plain RMSNorm)."""
    if type(norm) is RMSNorm and (gemv := batch1_gemv(x, linear, projection)) is not None:
        return gemv.rms_norm_gemv(x, residual, norm.weight, norm.eps, linear.weight, linear.bias)
    if residual is None:
        residual, x = x, norm(x)
    else:
        x, residual = norm(x, residual)
    return linear(x), residual


def norm_router(x, residual, norm: nn.Module, router: nn.Module):
    """(router logits or None, norm(x + residual), x + residual) for a mixture-of-experts
    block: at batch 1, where the fused gemv serves (a plain RMSNorm, a 16-bit router of the
    activations' dtype), one kernel gives all three; otherwise the norm alone runs here and
    the logits are None (the block routes itself)."""
    if (
        type(norm) is RMSNorm
        and x.shape[0] == 1
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and router.weight.dtype == x.dtype
        and router.weight.is_contiguous()
        and residual is not None
        and x.is_contiguous()
        and residual.is_contiguous()
    ):
        from cadence.ops import gemv

        if "router" in gemv.FUSED_PROJECTIONS:
            return gemv.rms_norm_gemv(
                x, residual, norm.weight, norm.eps, router.weight, router.bias, keep_normed=True
            )
    x, residual = norm(x, residual)
    return None, x, residual
