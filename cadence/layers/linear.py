"""Linear layers that know tensor parallelism, and how each rank loads its shard.

    ColumnParallelLinear  output features split over ranks; no communication. Holds one or
                          more logical projections fused ([q; k; v], [gate; up]), each
                          split on its own, so a rank's weight is [q_r; k_r; v_r].
    RowParallelLinear     input features split over ranks; partial sums all-reduced. Its
                          bias is added by rank 0 only (`local_bias`), before the reduce.

With one rank both are a plain linear over the whole weight. Weights load per shard from
anything sliceable like a tensor (a torch.Tensor, or a safetensors slice that reads only
the rows or columns asked for): `load(kind, source, shard)`, kind "weight" or "bias" (or a
format's own, such as FP8's "weight_scale"). How the weight is held and multiplied is the
layer's `quant_method` (cadence/quant/): these classes only say which rows and columns of
each checkpoint tensor a rank holds.

KV heads and ranks (ColumnShard.for_kv_heads): with at least as many KV heads as ranks,
each rank holds kv_heads / ranks of them; with fewer, each KV head is replicated on
ranks / kv_heads consecutive ranks, so a rank holds exactly one, the one its query heads
group over.

    8 q heads, 2 kv heads, 4 ranks:   rank  0     1     2     3
                                      q     0,1   2,3   4,5   6,7
                                      kv    0     0     1     1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cadence.distributed.communication import all_reduce
from cadence.distributed.parallel_state import get_tp
from cadence.quant.base import current_method, shape_of

__all__ = ["ColumnParallelLinear", "ColumnShard", "RowParallelLinear", "divide", "shape_of"]


def divide(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size {parts}")
    return n // parts


@dataclass(frozen=True)
class ColumnShard:
    """One logical projection inside a column-parallel weight: the checkpoint has `rows`
    output rows; this rank holds rows [start, start + count)."""

    rows: int
    start: int
    count: int

    @classmethod
    def split(cls, rows: int, what: str) -> ColumnShard:
        tp = get_tp()
        count = divide(rows, tp.size, what)
        return cls(rows, tp.rank * count, count)

    @classmethod
    def for_kv_heads(cls, num_kv_heads: int, head_dim: int) -> ColumnShard:
        tp = get_tp()
        if num_kv_heads >= tp.size:
            return cls.split(num_kv_heads * head_dim, "the number of KV heads")
        if tp.size % num_kv_heads:
            raise ValueError(
                f"{num_kv_heads} KV heads cannot be replicated evenly over {tp.size} ranks"
            )
        head = tp.rank * num_kv_heads // tp.size
        return cls(num_kv_heads * head_dim, head * head_dim, head_dim)


def check_shardable(hf_config, size: int) -> None:
    """Raise ValueError, before any rank starts, if the model cannot split over `size`."""
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    divide(heads, size, "the number of attention heads")
    divide(hf_config.intermediate_size, size, "intermediate_size")
    if kv < size and size % kv:
        raise ValueError(f"{kv} KV heads cannot be replicated evenly over {size} ranks")
    if kv >= size:
        divide(kv, size, "the number of KV heads")


def local_kv_heads(num_kv_heads: int) -> int:
    """KV heads this rank holds (see ColumnShard.for_kv_heads)."""
    return max(1, num_kv_heads // get_tp().size)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, shards: list[ColumnShard], bias: bool) -> None:
        super().__init__()
        self.shards = shards
        self.offsets = [sum(s.count for s in shards[:i]) for i in range(len(shards))]
        out_local = sum(s.count for s in shards)
        self.in_features = in_features
        self.quant_method = current_method().linear()
        self.quant_method.create_weights(self, out_local, in_features)
        self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    def load(self, kind: str, source, shard: int = 0) -> None:
        s = self.shards[shard]
        if kind == "bias" and self.bias is None:
            raise ValueError("unexpected bias for a projection without one")
        shape = shape_of(source)
        if kind in ("weight", "bias") and (
            shape[0] != s.rows or (kind == "weight" and shape[1:] != (self.in_features,))
        ):
            raise ValueError(f"shard {shard}: checkpoint shape {shape} does not fit {s.rows} rows")
        at = self.offsets[shard]
        rows = slice(s.start, s.start + s.count)
        self.quant_method.load(self, kind, source, rows, None, slice(at, at + s.count))


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, what: str) -> None:
        super().__init__()
        tp = get_tp()
        self.in_local = divide(in_features, tp.size, what)
        self.start = tp.rank * self.in_local
        self.out_features = out_features
        self.quant_method = current_method().linear()
        self.quant_method.create_weights(self, out_features, self.in_local)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.adds_bias = tp.rank == 0

    @property
    def local_bias(self) -> torch.Tensor | None:
        """The bias this rank adds to its partial sum: rank 0 adds it, once."""
        return self.bias if self.adds_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.quant_method.apply(self, x, self.local_bias))

    def load(self, kind: str, source, shard: int = 0) -> None:
        shape = shape_of(source)
        every = slice(0, self.out_features)
        if kind == "bias":
            if self.bias is None or shape != (self.out_features,):
                raise ValueError(f"bias of shape {shape} does not fit")
            self.quant_method.load(self, kind, source, every, None, every)
            return
        if kind == "weight":
            full = (self.out_features, self.in_local * get_tp().size)
            if shape != full:
                raise ValueError(f"checkpoint shape {shape} != model's {full}")
        cols = slice(self.start, self.start + self.in_local)
        self.quant_method.load(self, kind, source, every, cols, every)
