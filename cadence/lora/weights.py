"""The worker's side of an adapted projection: every slot's A and B, stacked.

A projection is adapted by wrapping its quant method (`LoRALinearMethod`): the base
product first, in whatever format the base keeps (bf16, FP8, GGUF), then + x A B for the
tokens of an adapter. The fused batch-1 kernels (models/fused.py) see no plain weight and
step aside.

One projection may fuse several of PEFT's ([q; k; v], [gate; up]): its A is
[slots, in, R] with each part's A in its own band of max_rank columns, its B [slots, R,
out] block-diagonal (part j's band of rows feeds part j's output columns only), so one
pair of products serves every part; R is the bands' width rounded up to a power of two
(the kernels' tile). The scale is folded into B.

Under tensor parallelism A and B shard like the base weight: a column-parallel
projection keeps all of A and its rows of each part's B; a row-parallel one its columns
of A and all of B, so its partial x_i A_i B sums over ranks in the layer's all-reduce.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.layers.linear import ColumnParallelLinear, RowParallelLinear
from cadence.lora.batch import LoRABatch


class LoRAWeights:
    """Stacked A / B of every slot for one projection (see the module docstring)."""

    def __init__(
        self,
        layer: nn.Module,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if isinstance(layer, ColumnParallelLinear):
            self.parts = [
                (off, s.start, s.count, s.rows) for off, s in zip(layer.offsets, layer.shards)
            ]
            in_local, out_local = layer.in_features, sum(p[2] for p in self.parts)
            self.in_start = 0
        else:
            self.parts = [(0, 0, layer.out_features, layer.out_features)]
            in_local, out_local = layer.in_local, layer.out_features
            self.in_start = layer.start
        self.in_local = in_local
        self.max_rank = max_rank
        width = max(16, max_rank * len(self.parts))
        self.width = 1 << (width - 1).bit_length()
        self.a = torch.zeros(num_slots, in_local, self.width, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, self.width, out_local, dtype=dtype, device=device)

    def image(
        self, parts: dict[int | None, tuple[torch.Tensor, torch.Tensor, float]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot's A [in, R] and B [R, out] as this rank holds them, on the CPU in the
        slot's dtype, from the adapter's (A [r, in], B [rows, r], scale) per part index
        (parts it does not adapt stay zero); B holds the part's full checkpoint rows. Part
        None: one PEFT module over every part (a checkpoint that fuses them), its B's rows
        split among them. Made once per adapter (its CPU copy): a slot load is then two
        copies."""
        parts = dict(parts)
        if None in parts:
            a, b, scale = parts.pop(None)
            rows = [p[3] for p in self.parts]
            if b.shape[0] != sum(rows):
                raise ValueError(f"B has {b.shape[0]} rows, the projection {sum(rows)}")
            for j, first in enumerate(sum(rows[:j]) for j in range(len(rows))):
                parts[j] = (a, b[first : first + rows[j]], scale)
        dtype = self.a.dtype
        a_img = torch.zeros(self.in_local, self.width, dtype=dtype)
        b_img = torch.zeros(self.width, self.b.shape[-1], dtype=dtype)
        for j, (a, b, scale) in parts.items():
            off, start, count, _rows = self.parts[j]
            band = slice(j * self.max_rank, j * self.max_rank + a.shape[0])
            a_img[:, band] = a[:, self.in_start : self.in_start + self.in_local].t()
            b_img[band, off : off + count] = (b[start : start + count].float() * scale).t()
        return a_img, b_img

    def write(self, slot: int, image: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.a[slot].copy_(image[0])
        self.b[slot].copy_(image[1])


class LoRALinearMethod:
    """A projection's quant method with the adapters' products added after the base's."""

    def __init__(self, base, weights: LoRAWeights, batch: LoRABatch) -> None:
        self.base = base
        self.lora = weights
        self.batch = batch

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None):
        a, b = self.lora.a, self.lora.b
        started = self.batch.shrink(x, a)  # (on a GPU: beside the base GEMM)
        y = self.base.apply(layer, x, bias)
        self.batch.expand(y, x, started, a, b)
        return y

    def plain_weight(self, layer: nn.Module):
        return None  # (no fused batch-1 kernel: it would skip the adapters)

    def __getattr__(self, name: str):
        return getattr(self.base, name)


def peft_targets(model: nn.Module) -> dict[str, tuple[str, int | None]]:
    """PEFT's module names inside a decoder layer (`self_attn.q_proj`) -> (our module
    path, part index; None: every part, B's rows split among them) in `model`'s layers:
    the model's `fused_names` say which of ours fuse which of PEFT's, its
    `prefused_names` which a checkpoint (and so PEFT) already holds fused."""
    targets: dict[str, tuple[str, int | None]] = {}
    fused, prefused = model.fused_names, model.prefused_names
    layer = model.layers[0]
    for block in ("self_attn", "mlp"):
        for name, module in getattr(layer, block).named_children():
            if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
                continue
            ours = f"{block}.{name}"
            parts = [k for k, (v, _) in fused.items() if v == name]
            if parts and name not in prefused:
                for peft_name in parts:
                    targets[f"{block}.{peft_name}"] = (ours, fused[peft_name][1])
            else:
                targets[ours] = (ours, None if len(getattr(module, "shards", ())) > 1 else 0)
    return targets


def wrap_model(
    model: nn.Module,
    num_slots: int,
    max_rank: int,
    batch: LoRABatch,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[tuple[int, str], LoRAWeights]:
    """Wrap every adaptable projection of every layer: (layer, our module path) -> its
    weights. Nothing is read by a base-model token; adapter slots start empty."""
    ours = {path for path, _ in peft_targets(model).values()}
    out = {}
    for i, layer in enumerate(model.layers):
        for path in sorted(ours):
            try:
                module = layer.get_submodule(path)
            except AttributeError:
                continue  # (a layer of another kind: a mixture's MLP)
            if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
                continue
            weights = LoRAWeights(module, num_slots, max_rank, dtype, device)
            module.quant_method = LoRALinearMethod(module.quant_method, weights, batch)
            out[(i, path)] = weights
    return out
