"""What the expert paths share at their ends, so they round alike: the gated activation the
first GEMM ends with (cadence/ops/fused_moe.py's grouped GEMM, moe_pairs.py's GEMV), and the
sum over each token's slots the second ends with (fused_moe.sum_slots, moe_grouped_mm's
weighted sum)."""

from __future__ import annotations

import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait


@triton.jit
def gated_activation(gate, up, alpha, limit, dtype: tl.constexpr, ACT_CLAMPED: tl.constexpr):
    """act from the gate and up projections (float32 accumulators): each rounded to the
    activations' `dtype` first, as the projection's output would be; then silu(gate) * up
    (silu rounded too, as torch's SiluAndMul), or GPT-OSS's clamped SwiGLU (ACT_CLAMPED:
    g = min(gate, limit), (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)).
    Float32 out, for the caller to scale or store."""
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    if ACT_CLAMPED:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        act = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
    else:
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up
    return act


@triton.jit
def sum_slots_kernel(
    rows_ptr,  # [rows, H]: pairs' expert outputs (GATHER: in sorted order, else pair order)
    row_of_ptr,  # [T * k] int32: each pair's row, -1 for none (GATHER only)
    weights_ptr,  # [T * k] routing weights (GATHER only)
    out_ptr,  # [T, H]
    hidden,
    top_k,
    GATHER: tl.constexpr,  # rows not yet weighted, found through row_of; else row = pair
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """out[t] = sum over slots j of token t's pair row, in slot order (as torch's sum over a
    short dim), in float32; with GATHER each row is first scaled by its routing weight and
    rounded to out's dtype, as the Triton down GEMM rounds each pair's scaled output."""
    if PDL:
        gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for slot in range(top_k):
        pair = token * top_k + slot
        if GATHER:
            row = tl.load(row_of_ptr + pair).to(tl.int64)
            weight = tl.load(weights_ptr + pair).to(tl.float32)
            has_row = ok & (cols * 0 + row >= 0)  # (-1: the pair is another rank's)
            o = tl.load(rows_ptr + row * hidden + cols, mask=has_row, other=0.0)
            acc += (o.to(tl.float32) * weight).to(out_ptr.dtype.element_ty).to(tl.float32)
        else:
            acc += tl.load(rows_ptr + pair * hidden + cols, mask=ok).to(tl.float32)
    tl.store(out_ptr + token * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
