"""GGUF weights kept quantized: each linear layer and the vocabulary hold the file's blocks
and multiply through a kernel that expands them on the fly:

    CPU    the blocks' codes in 16-row panels (gguf_cpu.py: every format, one product
           for the whole batch); where the CPU kernels are not built, 4-bit planes
           through torch's packed int4 kernel (int4_cpu.py), groups of 32 and more
    CUDA   4-bit planes (gguf_blocks.py) through a Triton dequantizing matmul
           (int4_triton.py), any group

A GGUF tensor arrives as a `GgufTensor` (its format name and raw rows, in Hugging Face's
layout: [out, in], Q/K rows already in HF's order); float tensors of the file (norms, an
F16 projection) arrive as plain tensors and stay plain. A layer fused from several
tensors ([q; k; v]) keeps one kernel when their formats agree, else one per part.
Without the CPU kernels, Q6_K (groups of 16, which torch's kernel lacks) is expanded to
the model's dtype at load, and the log says so.

A mixture's experts keep their blocks too, one expert at a time (gguf_experts.py); the
packed tensor and its kernels are gguf_packed.py's.

On a CPU with the kernels the vocabulary is one set of panels, for both the lookup and the
LM head. Elsewhere it keeps its codes (one byte a weight) for the lookup and builds the
planes kernel for the LM head's logits the first time they are asked for.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.quant import gguf_cpu
from cadence.quant.base import EmbeddingMethod, ExpertsMethod, LinearMethod, QuantMethod, read
from cadence.quant.gguf_blocks import Codes
from cadence.quant.gguf_experts import GgufExpertsMethod
from cadence.quant.gguf_packed import GgufTensor, kernel, kernels_for

__all__ = ["GgufQuant", "GgufTensor"]


class GgufLinearMethod(LinearMethod):
    name = "gguf"

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        # A placeholder, so the checkpoint's "...weight" names a parameter while loading.
        layer.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        layer.gguf_parts = []  # (first row, Codes or float tensor), in load order
        layer.gguf_dtype = torch.get_default_dtype()

    def load(self, layer, kind, source, rows, cols, dest) -> None:
        if kind != "weight":
            return super().load(layer, kind, source, rows, cols, dest)
        if cols is not None and (cols.start, cols.stop) != (0, source.shape[1]):
            raise ValueError("GGUF weights do not split over tensor-parallel ranks")
        part = read(source, rows, None)  # a view of a fused tensor's rows slices like one
        if isinstance(part, GgufTensor):
            part = part.codes()
        layer.gguf_parts.append((dest.start, part))

    def finish(self, layer: nn.Module) -> None:
        parts = [p for _, p in sorted(layer.gguf_parts, key=lambda item: item[0])]
        device, dtype = layer.bias.device if layer.bias is not None else None, layer.gguf_dtype
        kernels = kernels_for(parts, dtype, device or layer.weight.device)
        layer.kernels = nn.ModuleList(kernels)
        # The decode path calls this 120 times a step: keep the single kernel's forward
        # in the instance dict, out of nn.Module's attribute lookup and call machinery
        # (about 3 us a call: 0.4 ms of a 10 ms CPU step). No hooks are used on it.
        layer.__dict__["gguf_forward"] = kernels[0].forward if len(kernels) == 1 else None
        layer.weight = None
        del layer.gguf_parts

    def apply(self, layer, x, bias):
        flat = x.dim() == 2  # the engine's case: [tokens, features], no reshapes
        x2 = x if flat else x.reshape(-1, x.shape[-1])
        if (forward := layer.gguf_forward) is not None:
            y = forward(x2)
        else:
            y = torch.cat([k(x2) for k in layer.kernels], -1)
        if bias is not None:
            y = y + bias
        return y if flat else y.reshape(*x.shape[:-1], y.shape[-1])

    def plain_weight(self, layer):
        return None


class _CodesTable(nn.Module):
    """Codes on the device, for row lookups."""

    def __init__(self, codes: Codes, device: torch.device) -> None:
        super().__init__()
        self.register_buffer("v", codes.v.to(device))
        self.register_buffer("s", codes.s.to(device))
        self.register_buffer("c", codes.c.to(device))
        self.group, self.bits = codes.group, codes.bits

    def codes(self) -> Codes:
        return Codes(self.v, self.s, self.c, self.group, self.bits)


class GgufEmbeddingMethod(EmbeddingMethod):
    name = "gguf"

    def create_weights(self, layer: nn.Module, rows: int, hidden: int) -> None:
        # A table of shape only: the file's blocks usually replace it, and a float
        # [vocab, hidden] table made just to be dropped raised the load's peak memory
        # (SmolLM2: 56 MiB). A float tensor in the file gets a real one in `load`.
        layer.weight = nn.Parameter(torch.empty(rows, hidden, device="meta"), requires_grad=False)
        layer.gguf_device = torch.get_default_device()
        layer.gguf_codes = None
        layer.gguf_logits = None
        layer.gguf_dtype = torch.get_default_dtype()

    def load(self, layer, source, rows, count) -> None:
        if not isinstance(source, GgufTensor):  # a float table stays plain
            table = torch.empty(
                layer.weight.shape, dtype=layer.gguf_dtype, device=layer.gguf_device
            )
            layer.weight = nn.Parameter(table, requires_grad=False)
            return super().load(layer, source, rows, count)
        codes = source[rows].codes()
        pad = layer.weight.shape[0] - count
        if pad:  # rows past the vocabulary: all zero (v = 0, s = c = 0)
            nb = codes.s.shape[1]
            codes = Codes(
                torch.cat([codes.v, codes.v.new_zeros(pad, codes.v.shape[1])]),
                torch.cat([codes.s, codes.s.new_zeros(pad, nb)]),
                torch.cat([codes.c, codes.c.new_zeros(pad, nb)]),
                codes.group,
                codes.bits,
            )
        device = layer.gguf_device
        if device.type == "cpu" and gguf_cpu.available():  # one table: lookups and logits
            layer.gguf_logits = gguf_cpu.PanelsCPU(codes)
        else:
            layer.gguf_codes = _CodesTable(codes, device)
        layer.weight = None

    def embed(self, layer, ids):
        if isinstance(layer.gguf_logits, gguf_cpu.PanelsCPU):
            return layer.gguf_logits.rows(ids, layer.gguf_dtype)
        if layer.gguf_codes is None:
            return super().embed(layer, ids)
        return layer.gguf_codes.codes().rows(ids).to(layer.gguf_dtype)

    def logits(self, layer, hidden):
        if layer.gguf_logits is None:
            if layer.gguf_codes is None:
                return super().logits(layer, hidden)
            # Built on the first call (the memory profile's forward pass, before any graph).
            table = layer.gguf_codes
            layer.gguf_logits = kernel(table.codes(), layer.gguf_dtype, table.v.device)
            if not getattr(layer, "serves_lookup", True):
                layer.gguf_codes = None  # an LM head only: the planes are all it needs
        return layer.gguf_logits(hidden.reshape(-1, hidden.shape[-1]))


class GgufQuant(QuantMethod):
    name = "gguf"

    def linear(self) -> LinearMethod:
        return GgufLinearMethod()

    def embedding(self) -> EmbeddingMethod:
        return GgufEmbeddingMethod()

    def experts(self) -> ExpertsMethod:
        return GgufExpertsMethod()
