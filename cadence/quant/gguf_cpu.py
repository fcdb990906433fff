"""GGUF weights on a CPU, in their own codes: 16-row panels (cadence/csrc/cpu/panel_gemm.cpp).

A product unpacks each weight once per call and multiplies it into every row of the batch
(a few rows straight from the registers; from 12 rows the panel unpacked once into a
float32 buffer that every tile of rows reads), so 16 rows cost far less than 16 one-row
products, which is what torch's packed int4 kernel (int4_cpu.py) charged. Every GGUF
format fits: codes of up to 4 bits (Q4_0, Q4_1, Q4_K) two to a byte, wider codes (Q5_0,
Q5_1, Q5_K, Q6_K, Q8_0) one to a byte, one scale and one offset per group (16 or 32
columns), kept in float16 where every value is exact in it (Q4_0, Q4_1, Q8_0: the file's
own fp16 numbers) and in float32 otherwise (the K formats' products of two scales).

Sums are float32 and the weights are exactly gguf_blocks' dequantized values, whatever the
activations' dtype: in float32 the product equals x @ W.T of the dequantized W to the order
of the sums. Prefill-sized products stay on the panels too (70-80 GFLOP/s on two AVX2
cores, where expanding W^T for oneDNN's float32 GEMM reached 50-64), except where oneDNN
has a native 16-bit GEMM (AVX-512 BF16, AMX): there products of EXPAND_ROWS rows and more
expand W^T in the activations' dtype once for the call and run it.

Activations in 16 bits meet codes of up to 4 bits as int8 (cadence/csrc/cpu/panel_q8.cpp),
as llama.cpp multiplies Q4 weights by Q8 activations: each row quantized per block of 32
columns, integer dot products, the scales applied per block. It reads the same panels;
on an AVX2 machine a decode step's products (SmolLM2, 30 layers) took 4.7 ms instead of
12.6 at one row and 50.7 instead of 65.6 at 16 (benchmarks/gguf_cpu_sweep.py); with
AVX-512 VNNI (its `dpbusd`, where the CPU has it) 14.1 ms at 16 rows against 20.5 for the
AVX2 kernel on the same machine, with bit-identical results. Where the CPU has VNNI, codes
of up to 8 bits in groups of 32 (Q5_0, Q5_1, Q5_K, Q8_0: the tied Q8_0 LM head) take
it too (at 16 rows the head's 4.8 ms became 1.8), and from 16 rows AMX-INT8 tiles run
where the CPU has them (CADENCE_CPU_AMX=0 turns them off). The price
is the activations' rounding to 8 bits a block (bf16 itself keeps 8), so float32 models
keep the exact float path, and CADENCE_CPU_INT8_ACTIVATIONS=0 keeps it for every dtype.

From BF16_TILE_ROWS rows, where the CPU has AMX-BF16 (cadence/csrc/cpu/panel_bf16.cpp),
bf16 activations meet the weights dequantized to bf16 in registers instead: each block of
a panel is dequantized once and multiplied into every 16 rows by one tile product, where
the int8 tiles finish every block in float for every row. SmolLM2's decode step at 32
rows: 15.7 -> 9.5 ms of layer products, the head 3.5 -> 2.0 ms; the result is what the
prefill path's bf16 expansion computes (x times the bf16 weight, float32 sums), closer to
the exact product than the int8 one. CADENCE_CPU_AMX=0 turns both AMX paths off;
CADENCE_CPU_INT8_ACTIVATIONS=0 keeps both tile paths off (the exact float path).

The vocabulary keeps one copy: the embedding lookup reads rows out of the LM head's panels.

Plain bf16 weights take the same panels (`PanelsCPU.from_plain`, 16-bit "codes" with no
scale) on a CPU where oneDNN has no bf16 kernel: there torch's bf16 F.linear is its
reference loop, 2-4x slower than these panels at 4-16 rows (cadence/quant/plain_cpu.py).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from cadence.ops import cpu_ops
from cadence.quant.gguf_blocks import Codes

PANEL = 16  # weight rows a panel holds (two AVX2 vectors of float32)
# From this many rows a product expands W^T and runs oneDNN's native 16-bit GEMM, where the
# CPU has one (benchmarks/gguf_cpu_sweep.py: see benchmarks/RESULTS.md).
EXPAND_ROWS = 64
# ...unless W^T would take more than this many bytes (an LM head: 49152 x 576 floats is
# 113 MB a call, as much again as every weight of the model); those stay on the panels.
EXPAND_BYTES = 16 * 2**20
# 16-bit activations of products with 4-bit codes (8-bit with VNNI) run as int8 (see above);
# "0" turns it off.
INT8_ACTIVATIONS = os.environ.get("CADENCE_CPU_INT8_ACTIVATIONS", "1") != "0"
INT8_BLOCK = 32  # columns an activation's int8 scale covers: the groups must be multiples
# From this many bf16 rows, products take the AMX-BF16 tiles where there are some (at 16
# rows they cost what the int8 tiles do, at 32 40-45 % less: benchmarks/RESULTS.md).
BF16_TILE_ROWS = 16
# ...and below this many, rather than expanding W^T for oneDNN (or, for a table too large
# to expand, the int8 tiles): they beat the expansion by 1.3-2x at 64 rows and 1.2-1.5x at
# 128, and lose at 256 (each 48-row pass dequantizes every block again).
BF16_TILE_EXPAND_ROWS = 192


@functools.cache
def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype oneDNN's GEMM runs fast in for `dtype`: a 16-bit one only where oneDNN has
    a kernel for it on this CPU (AVX-512 BF16 / AMX). Without one (an AVX2 CPU) its 16-bit
    GEMM is a reference loop, measured 40x slower than float32."""
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32
    if dtype == torch.float16 and not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return torch.float32
    return dtype


def native_16bit(dtype: torch.dtype) -> bool:
    """Whether `dtype` is 16-bit and oneDNN has a native GEMM for it on this CPU."""
    return dtype in (torch.bfloat16, torch.float16) and gemm_dtype(dtype) == dtype


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


def pack_plain(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, sc) of the panel layout for a plain weight [N, K]: its bf16 values themselves
    (bits 16), and one group of scale 1, offset 0."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    w = torch.nn.functional.pad(weight.to(torch.bfloat16), (0, 0, 0, panels * PANEL - n))
    q = w.view(panels, PANEL, k).transpose(1, 2).contiguous().view(torch.uint8)  # [P, K, 32]
    sc = torch.zeros(panels, 1, 2, PANEL, dtype=torch.float16)
    sc[:, :, 0] = 1.0
    return q, sc


_expansions: dict[torch.dtype, torch.Tensor] = {}


def _expansion_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """One flat buffer per dtype that every prefill-sized product expands its W^T into
    (the products of a forward run one at a time, each done with W^T when it returns). A
    fresh tensor a call cost page faults on every use (14 of a 512-token step's ~190 ms on
    SmolLM2's 120 products), and the allocator kept the churn as resident memory."""
    buf = _expansions.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = _expansions[dtype] = torch.empty(numel, dtype=dtype)
    return buf


class PanelsCPU(nn.Module):
    """x @ W.T for a weight W [out_features, in_features] in panels: a GGUF weight's codes
    (`PanelsCPU(codes)`) or a plain bf16 weight (`PanelsCPU.from_plain(weight)`)."""

    def __init__(self, codes: Codes | None = None, *, plain: torch.Tensor | None = None) -> None:
        super().__init__()
        if codes is not None:
            self.out_features, self.in_features = codes.v.shape
            self.group = codes.group
            q, sc, self.bits = pack(codes)
        else:
            self.out_features, self.in_features = plain.shape
            self.group, self.bits = self.in_features, 16
            q, sc = pack_plain(plain)
        self.expandable = self.out_features * self.in_features * 4 <= EXPAND_BYTES
        self.register_buffer("q", q)
        self.register_buffer("sc", sc)
        self.ops = cpu_ops.ops()
        if self.ops is None:
            raise RuntimeError("the CPU kernels are not built: PanelsCPU cannot run")
        self.int8_activations = (
            INT8_ACTIVATIONS
            and self.bits in (4, 8)
            and self.group % INT8_BLOCK == 0
            and self.ops.panel_q8_available(self.bits)
        )
        self.bf16_tiles = (
            INT8_ACTIVATIONS  # (off: the exact float path, whatever the dtype)
            and self.bits in (4, 8)
            and self.group % INT8_BLOCK == 0
            and self.ops.panel_bf16_available(self.bits)
        )

    @classmethod
    def from_plain(cls, weight: torch.Tensor) -> PanelsCPU:
        """Panels of a plain weight [N, K], held in bf16 (exact for a bf16 weight)."""
        return cls(plain=weight)

    def expand(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """W^T [in_features, out_features] in `dtype` (into `out`, a flat buffer of at least
        that many elements, where given)."""
        shape, numel = (self.in_features, self.out_features), self.in_features * self.out_features
        w_t = torch.empty(shape, dtype=dtype) if out is None else out[:numel].view(shape)
        self.ops.expand_panels(w_t, self.q, self.sc, self.group, self.bits)
        return w_t

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """W[index] in `dtype` (an embedding lookup; ids out of range raise)."""
        flat = index.reshape(-1).to(torch.int64)
        out = torch.empty(flat.shape[0], self.in_features, dtype=dtype)
        self.ops.panel_rows(out, self.q, self.sc, flat, self.out_features, self.group, self.bits)
        return out.view(*index.shape, self.in_features)

    def expand_rows(self, dtype: torch.dtype) -> int | None:
        """From how many rows a product in `dtype` expands W^T for oneDNN's GEMM (None:
        never: no native 16-bit GEMM, or W^T too large)."""
        if not (self.expandable and native_16bit(dtype)):
            return None
        return BF16_TILE_EXPAND_ROWS if self._tiles(dtype) else EXPAND_ROWS

    def _tiles(self, dtype: torch.dtype) -> bool:
        return self.bf16_tiles and dtype == torch.bfloat16

    def register_tiles(self, x: torch.Tensor) -> bool | None:
        """Whether a product of x runs on the register tiles with int8 activations (True)
        or float ones (False); None: it expands W^T, or takes the AMX-BF16 tiles."""
        rows = x.shape[0]
        if (expand_rows := self.expand_rows(x.dtype)) is not None and rows >= expand_rows:
            return None
        if self._tiles(x.dtype) and BF16_TILE_ROWS <= rows < BF16_TILE_EXPAND_ROWS:
            return None
        return self.int8_activations and x.dtype != torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        int8 = self.register_tiles(x)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        if int8 is True:
            self.ops.panel_gemm_q8(out, x, self.q, self.sc, self.group, self.bits)
        elif int8 is False:
            self.ops.panel_gemm(out, x, self.q, self.sc, self.group, self.bits, False)
        elif self._tiles(x.dtype) and x.shape[0] < BF16_TILE_EXPAND_ROWS:
            self.ops.panel_gemm_bf16(out, x, self.q, self.sc, self.group, self.bits)
        else:
            numel = self.in_features * self.out_features
            return torch.mm(x, self.expand(x.dtype, _expansion_buffer(numel, x.dtype)))
        return out
