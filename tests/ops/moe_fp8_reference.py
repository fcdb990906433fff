"""The W8A8 math of FP8 experts done expert by expert in float32, which the W8A8 paths
(cadence/ops/moe_grouped_mm.py's scaled grouped GEMM, moe_w8a8.py's Triton GEMMs) must
equal to rounding; and the same experts with 16-bit activations (W8A16), which they must be
near."""

from __future__ import annotations

import torch


def fp8_rows_dequantized(v: torch.Tensor) -> torch.Tensor:
    """Rows of v (float32) after a round trip through e4m3, each row scaled to 448 (the
    torch form of the row quantizer, which tests/ops/test_fp8_rows.py specifies)."""
    from cadence.ops.fp8_rows import quantize_rows_torch

    q, scale = quantize_rows_torch(v)
    return q.float() * scale


def fp8_reference(x, w13, s13, w2, s2, ids, weights, first_expert=0) -> torch.Tensor:
    """W8A8 experts expert by expert in float32: the tokens and the activation quantized
    per row, each GEMM's output rounded to x's dtype (as the kernels round); in x's dtype
    where that is 16-bit, else bf16 (the scaled grouped GEMM's output)."""
    dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    top_k = ids.shape[1]
    flat = ids.flatten() - first_expert
    tokens = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    xd = fp8_rows_dequantized(x.float())
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        pairs = (flat == e).nonzero().flatten()
        if not len(pairs):
            continue
        h = (xd[tokens[pairs]] @ (w13[e].float() * s13[e][:, None]).t()).to(dtype)
        gate, up = h.chunk(2, dim=1)
        act = (torch.nn.functional.silu(gate) * up).float()
        o = (fp8_rows_dequantized(act) @ (w2[e].float() * s2[e][:, None]).t()).to(dtype)
        out.index_add_(0, tokens[pairs], o.float() * weights.flatten()[pairs, None].float())
    return out.to(dtype)


def fp8_reference_16bit(x, w13, s13, w2, s2, ids, weights) -> torch.Tensor:
    """The same experts with activations kept 16-bit (W8A16): the per-expert torch path on
    the dequantized weights."""
    from cadence.models.moe import FusedExperts

    ref = FusedExperts(w13.shape[0], x.shape[1], w2.shape[2]).to(x.device, torch.float32)
    ref.w13_weight.data = w13.float() * s13[:, :, None]
    ref.w2_weight.data = w2.float() * s2[:, :, None]
    return ref.forward_reference(x.float(), ids, weights.float()).bfloat16()
