"""FP8 W8A8 (e4m3): weights one byte each with a float32 scale per output channel,
activations quantized per token on the fly (or by a checkpoint's static scale), products
through cuBLASLt's FP8 GEMM with fp32 accumulation.

Where the weights come from:
    a 16-bit checkpoint     `--quantization fp8`: each layer quantized once, at load
                            (per channel: the row's largest magnitude maps to 448)
    an FP8 checkpoint       config.json's quantization_config, either
                            {"quant_method": "fp8", "activation_scheme": "dynamic"|"static"}
                            (weight_scale a scalar per tensor, input_scale if static), or
                            compressed-tensors' float-quantized layout (weight_scale per
                            tensor [1] or per channel [out, 1]; input_activations dynamic
                            per token, or static per tensor)
    dummy weights           drawn in 16 bits, then quantized like a 16-bit checkpoint

Per-tensor scales of a fused layer's parts ([q; k; v]) become per-channel rows, so every
layer runs one rowwise-scaled GEMM; static input scales of fused parts take their maximum.
A layer the checkpoint left in 16 bits (its `ignore` list) stays a plain layer.

At batch 1 a step reads every weight once: there a Triton gemv reads the e4m3 weights
against the 16-bit activation row directly (fp8_kernels.fp8_gemv), which needs no
quantization kernel before each product (W8A16 there: more exact than W8A8, and the same
bytes); a few rows more take Triton's W8A8 GEMM, many take cuBLASLt's (see below); `CADENCE_FP8_TRITON=0` sends
every batch to cuBLASLt's GEMM.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from cadence.quant import fp8_kernels as fk
from cadence.quant.base import (
    ExpertsMethod,
    LinearMethod,
    QuantMethod,
    dtype_of,
    read,
    shape_of,
)
from cadence.quant.fp8_experts import Fp8ExpertsMethod
from cadence.quant.fp8_scheme import Fp8Scheme, scheme_from_config  # noqa: F401 (re-exported)

# Which kernel a product takes, by rows M of activations (CUDA). Measured on an H200 at
# Llama-3.1-8B's shapes (benchmarks/fp8_gemm_sweep.py, benchmarks/RESULTS.md):
#   M = 1                the e4m3 weights meet the 16-bit activation row in a Triton gemv:
#                        1.7-1.8x bf16's cuBLAS
#   M <= TRITON_MM_ROWS  per-token quantization + Triton's W8A8 GEMM (fp8_kernels.fp8_mm):
#                        from 8 to 128 rows it beat torch._scaled_mm on every projection but
#                        one (gate_up at 128), and a tensor-core kernel on 16-bit activations
#   above                per-token quantization + torch._scaled_mm (cuBLASLt)
# CADENCE_FP8_TRITON=0 sends every product to torch._scaled_mm.
USE_TRITON = os.environ.get("CADENCE_FP8_TRITON", "1") != "0"
TRITON_MM_ROWS = 128


class Fp8LinearMethod(LinearMethod):
    name = "fp8"

    def __init__(self, scheme: Fp8Scheme) -> None:
        self.scheme = scheme

    def create_weights(self, layer: nn.Module, out_features: int, in_features: int) -> None:
        dtype = fk.FP8 if self.scheme.serialized else torch.get_default_dtype()
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        layer.weight_scale = nn.Parameter(torch.ones(out_features, dtype=torch.float32), False)
        if self.scheme.static_input:
            layer.input_scale = nn.Parameter(torch.zeros(1, dtype=torch.float32), False)
        layer.fp8_plain = False  # a layer the checkpoint keeps in 16 bits

    def load(self, layer, kind, source, rows, cols, dest) -> None:
        if kind == "weight" and self.scheme.serialized and dtype_of(source) != fk.FP8:
            if not layer.fp8_plain:  # an ignored layer: 16-bit weights, plain product
                shape = tuple(layer.weight.shape)
                layer.weight = nn.Parameter(torch.empty(shape, device=layer.weight.device), False)
                layer.fp8_plain = True
            return super().load(layer, kind, source, rows, cols, dest)
        if kind == "weight_scale":
            scale = _as_float(source)
            if scale.numel() == 1:  # per tensor: every row of this part
                layer.weight_scale.data[dest] = scale.reshape(())
            else:  # per channel [out, 1]: this rank's rows
                layer.weight_scale.data[dest] = read(source, rows, None).reshape(-1).float()
            return None
        if kind == "input_scale":
            scale = _as_float(source).reshape(-1)[0]
            layer.input_scale.data.fill_(max(float(layer.input_scale), float(scale)))
            return None
        return super().load(layer, kind, source, rows, cols, dest)

    def finish(self, layer: nn.Module) -> None:
        if layer.fp8_plain or self.scheme.serialized:
            return
        q, scale = fk.quantize_weight(layer.weight.data)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)

    def apply(self, layer, x, bias):
        if layer.fp8_plain:
            return F.linear(x, layer.weight, bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        out_dtype = x.dtype if x.dtype != torch.float32 else torch.bfloat16
        m = x2.shape[0]
        fast = x2.is_cuda and USE_TRITON
        if fast and m == 1 and not self.scheme.static_input:
            y = fk.fp8_gemv(x2.contiguous(), layer.weight, layer.weight_scale, bias)
        else:
            if self.scheme.static_input:
                xq, xs = fk.quantize_static(x2, layer.input_scale)
            else:
                xq, xs = fk.quantize_per_token(x2)
            if fast and m <= TRITON_MM_ROWS:
                n = layer.weight.shape[0]
                cfg = fk.MM_CONFIG_WIDE if n >= fk.MM_WIDE_N else fk.MM_CONFIG
                y = fk.fp8_mm(xq, xs, layer.weight, layer.weight_scale, bias, out_dtype, cfg)
            else:
                ws = layer.weight_scale.view(1, -1)
                y = fk.scaled_mm(xq, xs, layer.weight, ws, bias, out_dtype)
        return y.to(x.dtype).reshape(*lead, y.shape[-1])

    def plain_weight(self, layer):
        return layer.weight if layer.fp8_plain else None


def _as_float(source) -> torch.Tensor:
    """A scale tensor (a safetensors slice of any rank, 0-d included) as float32."""
    if isinstance(source, torch.Tensor):
        return source.float()
    return (source[...] if shape_of(source) == () else source[:]).float()


class Fp8Quant(QuantMethod):
    name = "fp8"

    def __init__(self, scheme: Fp8Scheme | None = None) -> None:
        self.scheme = scheme or Fp8Scheme()

    def linear(self) -> LinearMethod:
        return Fp8LinearMethod(self.scheme)

    def experts(self) -> ExpertsMethod:
        if self.scheme.serialized:
            raise NotImplementedError(
                "FP8 checkpoints of mixtures of experts are not supported yet: serve the "
                "16-bit checkpoint with --quantization fp8 (experts quantized at load)"
            )
        return Fp8ExpertsMethod()

    def describe(self) -> str:
        return self.scheme.describe()
