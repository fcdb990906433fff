"""GGUF weights on a CPU, in their own codes: 16-row panels (cadence/csrc/cpu/panel_gemm.cpp).

A product unpacks each weight once per call and multiplies it into every row of the batch
(up to 4 rows per unpack, the rest from L1), so 16 rows cost far less than 16 one-row
products, which is what torch's packed int4 kernel (int4_cpu.py) charged. Every GGUF
format fits: codes of up to 4 bits (Q4_0, Q4_1, Q4_K) two to a byte, wider codes (Q5_0,
Q5_1, Q5_K, Q6_K, Q8_0) one to a byte, one scale and one offset per group (16 or 32
columns), kept in float16 where every value is exact in it (Q4_0, Q4_1, Q8_0: the file's
own fp16 numbers) and in float32 otherwise (the K formats' products of two scales).

Sums are float32 and the weights are exactly gguf_blocks' dequantized values, whatever the
activations' dtype: in float32 the product equals x @ W.T of the dequantized W to the order
of the sums. Prefill-sized products (EXPAND_ROWS rows and more) expand W^T once for the
call and run oneDNN's GEMM, where a tuned float kernel beats unpacking per tile.

The vocabulary keeps one copy: the embedding lookup reads rows out of the LM head's panels.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from cadence.ops import cpu_ops
from cadence.quant.gguf_blocks import Codes

PANEL = 16  # weight rows a panel holds (two AVX2 vectors of float32)
# From this many rows a product expands W^T and runs oneDNN's GEMM (benchmarks/
# gguf_cpu_sweep.py on a 2-core AVX2 machine, SmolLM2's shapes: see benchmarks/RESULTS.md).
EXPAND_ROWS = 64
# ...unless W^T would take more than this many bytes (an LM head: 49152 x 576 floats is
# 113 MB a call, as much again as every weight of the model); those stay on the panels.
EXPAND_BYTES = 16 * 2**20


@functools.cache
def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a prefill-sized product runs oneDNN's GEMM in: a 16-bit one only where
    oneDNN has a kernel for it on this CPU (AVX-512 BF16 / AMX). Without one (an AVX2 CPU)
    its 16-bit GEMM is a reference loop, measured 40x slower than float32."""
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32
    if dtype == torch.float16 and not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return torch.float32
    return dtype


def available() -> bool:
    """Whether the panel kernels are built (else the layers keep torch's int4 kernel)."""
    return cpu_ops.ops() is not None


def pack(codes: Codes) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(q, sc, bits) of the panel layout (panel_gemm.cpp) for a Codes [N, K]."""
    n, k = codes.v.shape
    group, panels = codes.group, -(-n // PANEL)
    pad = panels * PANEL - n
    v = torch.nn.functional.pad(codes.v, (0, 0, 0, pad))  # padding rows: v = s = c = 0
    v = v.view(panels, PANEL, k).transpose(1, 2)  # [P, K, 16]
    if codes.bits <= 4:
        q, bits = v[..., :8] | (v[..., 8:] << 4), 4
    else:
        q, bits = v, 8
    sc = torch.stack([codes.s, codes.c], 1)  # [N, 2, K / group]
    sc = torch.nn.functional.pad(sc, (0, 0, 0, 0, 0, pad))
    sc = sc.view(panels, PANEL, 2, k // group).permute(0, 3, 2, 1)  # [P, K / group, 2, 16]
    half = sc.to(torch.float16)
    exact = bool(torch.equal(half.float(), sc))
    return q.contiguous(), (half if exact else sc).contiguous(), bits


class PanelsCPU(nn.Module):
    """x @ W.T for a GGUF weight W [out_features, in_features], from its codes in panels."""

    def __init__(self, codes: Codes) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.v.shape
        self.group = codes.group
        self.expandable = self.out_features * self.in_features * 4 <= EXPAND_BYTES
        q, sc, self.bits = pack(codes)
        self.register_buffer("q", q)
        self.register_buffer("sc", sc)
        self.ops = cpu_ops.ops()
        if self.ops is None:
            raise RuntimeError("the CPU kernels are not built: PanelsCPU cannot run")

    def expand(self, dtype: torch.dtype) -> torch.Tensor:
        """W^T [in_features, out_features] in `dtype`."""
        w_t = torch.empty(self.in_features, self.out_features, dtype=dtype)
        self.ops.expand_panels(w_t, self.q, self.sc, self.group, self.bits)
        return w_t

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """W[index] in `dtype` (an embedding lookup; ids out of range raise)."""
        flat = index.reshape(-1).to(torch.int64)
        out = torch.empty(flat.shape[0], self.in_features, dtype=dtype)
        self.ops.panel_rows(out, self.q, self.sc, flat, self.out_features, self.group, self.bits)
        return out.view(*index.shape, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= EXPAND_ROWS and self.expandable:
            dtype = gemm_dtype(x.dtype)
            return torch.mm(x.to(dtype), self.expand(dtype)).to(x.dtype)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        self.ops.panel_gemm(out, x, self.q, self.sc, self.group, self.bits, False)
        return out
