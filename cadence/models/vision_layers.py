"""Layers the vision encoders share: they run on every rank whole (no tensor parallelism:
an encoder is small beside its language model) and keep their checkpoints' names.

    StackedLinear   a linear layer a checkpoint stores as pieces (q, k, v): each piece
                    loads into its rows (the loader's `fused_names` names the piece)
    ACTIVATIONS     the encoders' activation functions by config name
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.layers.linear import shape_of


class StackedLinear(nn.Linear):
    def __init__(self, in_features: int, rows: list[int], bias: bool = True) -> None:
        super().__init__(in_features, sum(rows), bias=bias)
        self.shards = rows  # rows of each piece, in order (what the loader checks for)

    def load(self, kind: str, source, shard: int = 0) -> None:
        param = getattr(self, kind)
        start, count = sum(self.shards[:shard]), self.shards[shard]
        expected = (count, *param.shape[1:])
        if tuple(shape_of(source)) != expected:
            raise ValueError(
                f"shape {tuple(shape_of(source))} of piece {shard}: expected {expected}"
            )
        param.data[start : start + count].copy_(source[:])


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"vision activation {name!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]
