"""A GGUF file's quantized tensors as the model holds them: `GgufTensor` (the raw blocks
of one tensor, sliced by rows or, for a stack of experts, by expert) and the modules that
multiply by blocks (`kernel`: panels on a CPU, 4-bit planes through Triton on CUDA, an
expanded weight where neither fits).

Shared by the linear layers and vocabulary (gguf.py) and the experts (gguf_experts.py).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from cadence.quant import gguf_cpu
from cadence.quant.gguf_blocks import Codes, decode, to_planes

logger = logging.getLogger(__name__)


def _whole(index, length: int) -> bool:
    return isinstance(index, slice) and index.indices(length) == (0, length, 1)


class GgufTensor:
    """One quantized tensor of a GGUF file in Hugging Face's layout: [out, in], or a stack
    of experts [E, out, in]; its format and its raw rows (uint8 [..., out, row bytes]).
    Indexing takes rows, or one expert of a stack (`t[e]`, `t[e, a:b]`); a column slice
    must cover the whole row (blocks do not split across columns)."""

    def __init__(self, kind: str, raw: np.ndarray, shape: tuple[int, ...]) -> None:
        self.kind = kind
        self.raw = raw
        self.shape = tuple(shape)

    def __getitem__(self, index) -> GgufTensor:
        index = index if isinstance(index, tuple) else (index,)
        if len(self.shape) == 3 and isinstance(index[0], int):  # one expert of a stack
            expert = GgufTensor(self.kind, self.raw[index[0]], self.shape[1:])
            return expert[index[1:]] if len(index) > 1 else expert
        rows, *rest = index
        if not isinstance(rows, slice) or any(not _whole(r, self.shape[-1]) for r in rest):
            raise TypeError("a GGUF tensor slices by rows (or by expert) only")
        raw = self.raw[rows]
        return GgufTensor(self.kind, raw, (*self.shape[:-2], raw.shape[-2], self.shape[-1]))

    def codes(self) -> Codes:
        if len(self.shape) != 2:
            raise TypeError(f"a stack of GGUF experts {self.shape} decodes one expert at a time")
        return decode(self.kind, self.raw, self.shape)


def kernel(codes: Codes, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A module computing x @ W.T for the weight `codes` hold, x in `dtype` on `device`."""
    if device.type == "cuda":
        from cadence.quant.int4_triton import Int4Planes

        return Int4Planes(to_planes(codes), device)
    from cadence.quant import int4_cpu

    if gguf_cpu.available():
        return gguf_cpu.PanelsCPU(codes)
    if int4_cpu.supported(planes := to_planes(codes)):
        return int4_cpu.Int4PackCPU(planes, dtype)
    logger.info("GGUF groups of %d: expanded to %s at load (no CPU kernel)", codes.group, dtype)
    return Dense(codes.dequantize().to(dtype))


class Dense(nn.Module):
    """x @ W.T for a weight kept expanded (a float tensor of the file, or no kernel)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


def _concat(parts: list[Codes]) -> Codes | None:
    """The parts' rows as one Codes, when their formats agree (else None)."""
    first = parts[0]
    if any(p.group != first.group or (p.bits <= 4) != (first.bits <= 4) for p in parts):
        return None
    return Codes(
        torch.cat([p.v for p in parts]),
        torch.cat([p.s for p in parts]),
        torch.cat([p.c for p in parts]),
        first.group,
        max(p.bits for p in parts),
    )


def kernels_for(
    parts: list[Codes | torch.Tensor], dtype: torch.dtype, device: torch.device
) -> list[nn.Module]:
    """The modules of a weight made of `parts` (row blocks, in order: [q; k; v], [gate;
    up]): one kernel when every part is blocks of one format, else one per part, their
    outputs to be concatenated."""
    if parts and all(isinstance(p, Codes) for p in parts) and (whole := _concat(parts)):
        return [kernel(whole, dtype, device)]
    return [
        kernel(p, dtype, device) if isinstance(p, Codes) else Dense(p.to(device, dtype))
        for p in parts
    ]
