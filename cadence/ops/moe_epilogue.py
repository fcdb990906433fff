"""The gated activation both expert kernels end their first GEMM with (cadence/ops/
fused_moe.py's grouped GEMM, moe_pairs.py's GEMV), so the two paths round alike."""

from __future__ import annotations

import triton
import triton.language as tl


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
