"""Rows of 16-bit activations to FP8 (e4m3), each row with its own float32 scale (per-token
activations: the W8A8 GEMMs' left operand).

    quantize_rows(x)        x [M, K] -> (e4m3 [M, K], float32 scales [M, 1]): each row
                            scaled so its largest magnitude is FP8_MAX
    silu_mul_quantize(h)    [gate | up] rows [M, 2D] -> the rows of silu(gate) * up, quantized
                            as quantize_rows does, without the 16-bit activation ever
                            reaching memory (a W8A8 expert MLP's down GEMM takes these)

silu(gate) * up is rounded as `fused.silu_and_mul` rounds it (the activation, then the
product, each to the input's dtype) before it is scaled, so the only difference from the
16-bit path is the quantization. A row is read twice: once for its largest magnitude, once
to scale it (the second read comes from L2 at these widths). On a CPU the same math runs
through torch.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12  # an all-zero row still gets a finite scale

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install may lack triton: the torch paths serve
    triton = None


def _use_triton(x: torch.Tensor) -> bool:
    # (not under Triton's interpreter: its casts to e4m3 round unlike the GPU's and torch's)
    return triton is not None and x.is_cuda


if triton is not None:

    @triton.jit
    def _row_values(row_ptr, cols, K, GATED: tl.constexpr):
        """float32 values of one row's columns `cols`: the row itself, or silu(gate) * up of
        a [gate | up] row of width 2K (rounded as fused.silu_and_mul)."""
        mask = cols < K
        if GATED:
            gate = tl.load(row_ptr + cols, mask=mask, other=0.0)
            up = tl.load(row_ptr + K + cols, mask=mask, other=0.0)
            g = gate.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
            return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)
        return tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _quant_rows_kernel(
        x_ptr,
        q_ptr,
        s_ptr,
        K,  # columns out (a gated row has 2K in)
        stride_x,
        stride_q,
        GATED: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        amax = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(_row_values(x_row, cols, K, GATED)))
        scale = tl.maximum(tl.max(amax, 0) / 448.0, 1e-12)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            # (IEEE division, as torch's: `/` compiles to an approximate one, whose last
            # bit can move a value across an e4m3 rounding boundary)
            q = tl.clamp(tl.math.div_rn(_row_values(x_row, cols, K, GATED), scale), -448.0, 448.0)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)


def _quantize_torch(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = (v.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    return (v.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def _launch(x: torch.Tensor, k: int, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = min(2048 if gated else 4096, triton.next_power_of_2(k))
        _quant_rows_kernel[(m,)](
            x, q, s, k, x.stride(0), q.stride(0), GATED=gated, BLOCK=block, num_warps=4
        )
    return q, s


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] 16-bit (rows of unit stride) -> (e4m3 [M, K], float32 scales [M, 1])."""
    if _use_triton(x):
        return _launch(x, x.shape[1], gated=False)
    return _quantize_torch(x)


def silu_mul_quantize(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[gate | up] rows [M, 2D] 16-bit -> quantize_rows(silu(gate) * up): (e4m3 [M, D],
    float32 scales [M, 1])."""
    d = h.shape[1] // 2
    if _use_triton(h):
        return _launch(h, d, gated=True)
    gate, up = h[:, :d], h[:, d:]
    return _quantize_torch(torch.nn.functional.silu(gate) * up)
