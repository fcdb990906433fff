"""Plain bf16 weights on a CPU where oneDNN has bf16 GEMMs (AVX512-BF16, AMX): every
linear layer's weight reordered once, at load, into oneDNN's blocked layout, and its
products run by oneDNN's linear on that prepacked weight.

F.linear on the plain [out, in] weight lets oneDNN lay the weight out again for every
call: measured on a 2-core AMX Xeon (SmolLM2's shapes), a 576 -> 3,072 product took
164 us at one row where the prepacked weight took 89, 245 against 159 at 32 rows, and the
four products of a layer 351 against 180 us at one row. The outputs are F.linear's, bit for
bit (the same kernels, summing in the same order: checked at 1-512 rows with weights
packed for PACK_ROWS), and the packed weight takes the plain one's place (no second copy).

An untied LM head is packed too; a tied vocabulary table stays plain: it serves the
embedding lookups as well, and a packed copy of it would hold the table's bytes twice.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cadence.quant import gguf_cpu
from cadence.quant.base import EmbeddingMethod, LinearMethod, QuantMethod

# The batch rows oneDNN lays the weight out for. Packed for 32, products of 1 to 512 rows
# equal F.linear's bit for bit; packed for one row, prefill-sized products sum in another
# order (and were no faster).
PACK_ROWS = 32


def wanted(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a plain model of `dtype` on `device` takes prepacked oneDNN weights
    (CADENCE_CPU_PREPACK=0 keeps F.linear)."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and os.environ.get("CADENCE_CPU_PREPACK", "1") != "0"
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and gguf_cpu.native_16bit(dtype)
    )


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) for x [..., in] and W packed by `_reorder_linear_weight`."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # (oneDNN reads whole rows)
    y = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


class PrepackedLinearMethod(LinearMethod):
    """Loads like a plain layer (weight [out, in] in bf16); `finish` reorders it for oneDNN."""

    def finish(self, layer: nn.Module) -> None:
        layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.data, PACK_ROWS)
        layer.weight = None

    def apply(self, layer, x, bias):
        return _linear(x, layer.packed_weight, bias)

    def plain_weight(self, layer):
        return None


class PrepackedEmbeddingMethod(EmbeddingMethod):
    """A table used only for logits (an untied LM head: `serves_lookup` False) is packed;
    a table that also serves lookups stays plain."""

    def finish(self, layer: nn.Module) -> None:
        if getattr(layer, "serves_lookup", True):
            return
        layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.data, PACK_ROWS)
        layer.weight = None

    def logits(self, layer, hidden):
        packed = getattr(layer, "packed_weight", None)
        return super().logits(layer, hidden) if packed is None else _linear(hidden, packed, None)


class PrepackedQuant(QuantMethod):
    """The unquantized bf16 model ("none"), its linear layers on prepacked oneDNN weights."""

    name = "none"

    def linear(self) -> LinearMethod:
        return PrepackedLinearMethod()

    def embedding(self) -> EmbeddingMethod:
        return PrepackedEmbeddingMethod()

    def describe(self) -> str:
        return "none (bf16, linear weights prepacked for oneDNN)"
