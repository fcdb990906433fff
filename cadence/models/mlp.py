"""The feed-forward blocks: gated (SwiGLU / GeGLU over a fused gate-up projection) and plain
(up, activation, down: Starcoder2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.distributed.communication import all_reduce
from cadence.layers.activation import SiluAndMul
from cadence.layers.linear import ColumnParallelLinear, ColumnShard, RowParallelLinear
from cadence.models.fused import batch1_gemv


class GeluTanhAndMul(nn.Module):
    """x = [gate | up] -> gelu_tanh(gate) * up (Gemma's `gelu_pytorch_tanh`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 2 and x.stride(-1) == 1:
            from cadence.ops import fused  # one kernel instead of three

            return fused.silu_and_mul(x, gelu_tanh=True)
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


_GATED = {"silu": SiluAndMul, "swish": SiluAndMul, "gelu_pytorch_tanh": GeluTanhAndMul}
_PLAIN = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def activation_of(config) -> str:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")


class GatedMLP(nn.Module):
    """down(act(gate) * up), gate and up one fused column-parallel projection."""

    def __init__(self, config, bias: bool = False, act: str | None = None) -> None:
        super().__init__()
        act = act or activation_of(config)
        if act not in _GATED:
            raise ValueError(f"unsupported activation {act!r} (supported: {sorted(_GATED)})")
        inter = config.intermediate_size
        shard = ColumnShard.split(inter, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [shard, shard], bias=bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias, "intermediate_size")
        self.act = _GATED[act]()
        self.silu = _GATED[act] is SiluAndMul

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """From the projected gate_up [T, 2 * intermediate] to the block's output."""
        down = self.down_proj
        if self.silu and (gemv := batch1_gemv(gate_up, down, "down")) is not None:
            return all_reduce(gemv.silu_mul_gemv(gate_up, down.weight, down.local_bias))
        return down(self.act(gate_up))


class PlainMLP(nn.Module):
    """down(act(up(x))) with biases (c_fc / c_proj in Starcoder2's checkpoints)."""

    def __init__(self, config, bias: bool = True) -> None:
        super().__init__()
        act = activation_of(config)
        if act not in _PLAIN:
            raise ValueError(f"unsupported activation {act!r} (supported: {sorted(_PLAIN)})")
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [ColumnShard.split(inter, "intermediate_size")], bias=bias
        )
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias, "intermediate_size")
        self.act = _PLAIN[act]

    def forward(self, up: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(up))
