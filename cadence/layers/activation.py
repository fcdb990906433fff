"""Gated activations over a fused gate-up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.ops import cpu_ops


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim -> silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 2 and x.stride(-1) == 1:
            from cadence.ops import fused  # one Triton kernel instead of three

            return fused.silu_and_mul(x)
        if x.dim() == 2 and (ops := cpu_ops.usable(x)) is not None:
            return ops.silu_and_mul(x)  # one call instead of chunk / silu / mul
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class ClampedSwigluAndMul(nn.Module):
    """GPT-OSS's gate. x = [gate | up] -> (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha
    * g) with g = min(gate, limit)."""

    def __init__(self, alpha: float, limit: float) -> None:
        super().__init__()
        self.alpha, self.limit = alpha, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
