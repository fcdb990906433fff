"""4-bit planes on a CPU, through torch's packed int4 kernel
(`aten._weight_int4pack_mm_for_cpu`: AVX-512 / AVX2, weights unpacked in registers).

The kernel computes x W^T for W[n, k] = (q - 8) * scale + zero per group of 32, 64, 128
or 256 columns, with q packed by `_convert_weight_to_int4pack_for_cpu` and
scales_and_zeros [K / g, N, 2] in the activation dtype; N must be a multiple of 16 (the
rows are padded to a multiple of 64 with zeros, the padding cut off the output). A
two-plane weight is two products summed.

The kernel pays for unpacking in every product, which at many rows (a prefill chunk) costs
more than the bytes it saves: past DEQUANT_ROWS rows the weight is expanded once for the
call, from the same packed bytes (by a C++ kernel, cadence/csrc/cpu/int4.cpp), and
multiplied by oneDNN's 16-bit GEMM. The packed layout, for rows padded to a multiple of
64: per block of B rows, per column k, B / 2 bytes whose low nibbles are rows 0..B/2-1
and high nibbles rows B/2..B-1, where torch packs B = 64 rows on an AVX-512 CPU and 32 on
an AVX2 one (`pack_block_rows` asks the packing op itself once; the tests check the
expansion against the packing op, so a torch release that changes it fails there).
"""

from __future__ import annotations

import functools

import torch

from cadence.ops import cpu_ops
from cadence.quant.gguf_blocks import Planes

GROUPS = (32, 64, 128, 256)
# From this many rows of activations a product expands the weight (as W^T, the packed
# order) and runs oneDNN's GEMM. Measured on a 2-core AVX-512 machine
# (benchmarks/int4_cpu_sweep.py, SmolLM2's shapes): the packed kernel costs M times its
# one-row cost (0.012 ms a row for gate_up), the expansion about 0.2 ms once; at 32 rows
# packed still wins by 7-25 %, at 64 expanding wins by 10-35 %, at 128 by 1.6-1.9x.
DEQUANT_ROWS = 48

_int4_mm = torch.ops.aten._weight_int4pack_mm_for_cpu


@functools.cache
def pack_block_rows() -> int:
    """Rows per block of torch's int4 packing on this CPU, learned from the packing op: a
    one in row 16 lands in byte 16's low nibble with 64-row blocks, in byte 0's high
    nibble with 32-row blocks."""
    q = torch.zeros(64, 64, dtype=torch.int32)
    q[16, 0] = 1
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2).view(-1)
    if int(packed[16]) & 15 == 1:
        return 64
    if int(packed[0]) >> 4 == 1:
        return 32
    raise RuntimeError("torch's int4 packing has a layout Cadence does not know")


def supported(planes: Planes) -> bool:
    return planes.group in GROUPS and planes.q.shape[-1] % planes.group == 0


class Int4PackCPU(torch.nn.Module):
    def __init__(self, planes: Planes, dtype: torch.dtype) -> None:
        super().__init__()
        if not supported(planes):
            raise ValueError(f"the CPU int4 kernel takes groups of {GROUPS}, not {planes.group}")
        p, n, k = planes.q.shape
        n_pad = -(-n // 64) * 64
        self.out_features, self.in_features, self.group = n, k, planes.group
        self.n_pad = n_pad
        self.planes = p
        for i in range(p):
            q = torch.full((n_pad, k), 8, dtype=torch.int32)  # padding rows: value 0
            q[:n] = planes.q[i].to(torch.int32)
            zero = planes.zero if i == 0 else torch.zeros_like(planes.zero)
            sz = torch.zeros((n_pad, k // planes.group, 2), dtype=torch.float32)
            sz[:n, :, 0] = planes.scale[i]
            sz[:n, :, 1] = zero
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
            self.register_buffer(f"packed{i}", packed)
            self.register_buffer(f"sz{i}", sz.transpose(0, 1).contiguous().to(dtype))

    def dequantize(self, transposed: bool = False) -> torch.Tensor:
        """The weight [N, K] in the activation dtype (with `transposed`, W^T [K, N]
        contiguous: what the GEMM past DEQUANT_ROWS reads), from the packed bytes: by the
        C++ kernel where it is built (2.5x the PyTorch ops on layer shapes; it writes
        W^T, the packed order, and W is its transposed view), else in PyTorch ops. Both
        round alike and give the same bits (tested)."""
        if (ops := cpu_ops.usable(self.sz0)) is None:
            w = self.dequantize_torch()
            return w.t().contiguous() if transposed else w
        w_t = torch.empty(self.in_features, self.out_features, dtype=self.sz0.dtype)
        for i in range(self.planes):
            ops.expand_int4(
                w_t,
                getattr(self, f"packed{i}"),
                getattr(self, f"sz{i}"),
                self.group,
                i > 0,
                pack_block_rows(),
            )
        return w_t if transposed else w_t.t()

    def dequantize_torch(self) -> torch.Tensor:
        """dequantize in PyTorch ops. Computed in the packed order ([K, 64 rows] a block:
        no copy before the arithmetic), then one transposing copy; 1.8x faster than
        unpacking into [N, K] first."""
        n, k, g, rows = self.n_pad, self.in_features, self.group, pack_block_rows()
        blocks = n // rows
        w = None
        for i in range(self.planes):
            b = getattr(self, f"packed{i}").view(blocks, k, rows // 2)
            q = torch.cat([b & 15, b >> 4], 2).view(blocks, k // g, g, rows)
            sz = getattr(self, f"sz{i}").view(k // g, blocks, rows, 2).permute(1, 0, 2, 3)
            scale = sz[..., 0].unsqueeze(2).contiguous()  # [blocks, K / g, 1, rows]
            offset = sz[..., 1].unsqueeze(2) - 8 * scale
            part = torch.addcmul(offset, q.to(sz.dtype), scale)
            w = part if w is None else w + part
        return w.reshape(blocks, k, rows).transpose(1, 2).reshape(n, k)[: self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= DEQUANT_ROWS:  # x @ W^T with W^T expanded directly
            return torch.mm(x, self.dequantize(transposed=True).to(x.dtype))
        # The decode path: called 120 times a step for a 30-layer model, so it avoids
        # what costs microseconds (f-string buffer lookups, no-op slices and casts).
        dtype, sz0 = x.dtype, self.sz0
        if dtype != sz0.dtype:
            x = x.to(sz0.dtype)
        y = _int4_mm(x, self.packed0, self.group, sz0)
        for i in range(1, self.planes):
            y = y + _int4_mm(x, getattr(self, f"packed{i}"), self.group, getattr(self, f"sz{i}"))
        if self.n_pad != self.out_features:
            y = y[:, : self.out_features]
        return y if y.dtype == dtype else y.to(dtype)
