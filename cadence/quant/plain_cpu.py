"""Plain bf16 weights on a CPU without oneDNN bf16 kernels (AVX2, AVX-512 without BF16):
every linear layer and the vocabulary table repacked at load into the GGUF panels'
layout (gguf_cpu.PanelsCPU.from_plain), read once per product for every row of the batch.

There torch's bf16 F.linear falls back to its reference GEMM: on a 2-core AVX2 machine a
576 -> 3,072 product took 8.5 ms at 16 rows where float32 took 4.4 and the panels 1.4,
and prefill-sized products were 4x float32's time. The panels keep the weights in bf16
(no second copy), sum in float32 and round the output to bf16, as F.linear does, at
every batch size (prefill-sized products too: their buffered tiles beat expanding W^T for
oneDNN's float32 GEMM).

Where oneDNN has bf16 kernels (AVX-512 BF16, AMX), `wanted` is False and the model keeps
F.linear on its plain weights.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.quant import gguf_cpu
from cadence.quant.base import EmbeddingMethod, LinearMethod, QuantMethod


def wanted(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a plain model of `dtype` on `device` takes the panels."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and not gguf_cpu.native_16bit(dtype)  # oneDNN has no bf16 GEMM on this CPU
        and gguf_cpu.available()
    )


class PanelLinearMethod(LinearMethod):
    """Loads like a plain layer (weight [out, in] in bf16); `finish` moves it into panels."""

    def finish(self, layer: nn.Module) -> None:
        layer.panels = gguf_cpu.PanelsCPU.from_plain(layer.weight.data)
        # The decode path calls this ~100 times a step: a bound method in the instance
        # dict skips nn.Module's attribute lookup and call machinery.
        layer.__dict__["panel_forward"] = layer.panels.forward
        layer.weight = None

    def apply(self, layer, x, bias):
        flat = x.dim() == 2  # the engine's case: [tokens, features]
        y = layer.panel_forward(x if flat else x.reshape(-1, x.shape[-1]))
        if bias is not None:
            y = y + bias
        return y if flat else y.reshape(*x.shape[:-1], y.shape[-1])

    def plain_weight(self, layer):
        return None


class PanelEmbeddingMethod(EmbeddingMethod):
    """One table in panels for the lookup and (tied or not) the LM head's product."""

    def finish(self, layer: nn.Module) -> None:
        layer.panels = gguf_cpu.PanelsCPU.from_plain(layer.weight.data)
        layer.panel_dtype = layer.weight.dtype
        layer.weight = None

    def embed(self, layer, ids):
        return layer.panels.rows(ids, layer.panel_dtype)

    def logits(self, layer, hidden):
        return layer.panels(hidden.reshape(-1, hidden.shape[-1]))


class PanelQuant(QuantMethod):
    """The unquantized model ("none"), its products on the panels."""

    name = "none"

    def linear(self) -> LinearMethod:
        return PanelLinearMethod()

    def embedding(self) -> EmbeddingMethod:
        return PanelEmbeddingMethod()

    def describe(self) -> str:
        return "none (bf16 panels: this CPU has no oneDNN bf16 GEMM)"
