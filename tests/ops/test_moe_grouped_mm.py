"""Large steps' experts through torch's grouped GEMM (cadence/ops/moe_grouped_mm.py) equal the
per-expert torch path: the pairs sorted by expert with no padding (every pair once, each
expert's rows contiguous and ending at its group end, a pair routed to another rank's
expert with no row), the weighted sum over each token's slots, experts that get no token,
a rank holding half the experts, a step run in chunks of tokens; FP8 experts through the
W8A8 scaled GEMM equal the same math done expert by expert (tokens and activations
quantized per row); and fused_experts
takes the path only where the tile entry says "grouped_mm" and the experts allow it (no
biases; FP8 ones under bf16 activations). On a CPU the Triton launches run under the
interpreter in a child process, torch's grouped GEMM is its CPU fallback, and the scaled
one (CUDA only in torch) the module's dequantized fallback."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter
from moe_fp8_reference import fp8_reference, fp8_reference_16bit

pytest.importorskip("triton", reason="triton is not installed")


def check_sort_rows(device: str) -> None:
    from cadence.ops import moe_grouped_mm

    for tokens, experts, top_k, first, local in (
        (3, 8, 2, 0, 8),
        (300, 60, 6, 0, 60),  # more pairs than one scattering program takes
        (200, 8, 3, 4, 4),  # a rank holding experts 4-7
    ):
        ids = torch.rand(tokens, experts, device=device).topk(top_k, dim=1).indices
        rows, offsets, row_of = moe_grouped_mm.sort_rows(ids, local, first)
        flat = ids.flatten().tolist()
        ends = offsets.tolist()
        starts = [0] + ends[:-1]
        row_of = row_of.tolist()
        mine = [p for p, e in enumerate(flat) if first <= e < first + local]
        assert ends[-1] == len(mine)
        for e, (lo, hi) in enumerate(zip(starts, ends)):
            pairs = sorted(p for p in mine if flat[p] == first + e)
            assert hi - lo == len(pairs)  # an expert with no pair: an empty group
            assert sorted(row_of[p] for p in pairs) == list(range(lo, hi))
            for p in pairs:
                assert rows[row_of[p]] == p // top_k
        assert all(row_of[p] == -1 for p in range(len(flat)) if p not in set(mine))


def check_all(device: str) -> None:
    from cadence.models.moe import FusedExperts, route
    from cadence.ops import moe_grouped_mm

    torch.manual_seed(0)
    check_sort_rows(device)
    hidden, inter, num_experts = 48, 32, 8
    cases = [(torch.float32, 1e-4)] if device == "cpu" else []
    cases.append((torch.bfloat16 if device == "cuda" else torch.float16, 2e-2))
    for dtype, tol in cases:
        ref = FusedExperts(num_experts, hidden, inter).to(device, dtype)
        for p in ref.parameters():
            p.data.normal_(std=0.2)
        w13, w2 = ref.w13_weight, ref.w2_weight
        for tokens, top_k in ((1, 2), (37, 3), (600, 2)):
            x = torch.randn(tokens, hidden, device=device, dtype=dtype)
            logits = torch.randn(tokens, num_experts, device=device)
            logits[:, 6:] -= 100.0  # experts 6 and 7 never chosen
            weights, ids = route(logits, top_k, renormalize=True)
            want = ref.forward_reference(x, ids, weights)
            got = moe_grouped_mm.grouped_mm_experts(x, w13, w2, ids, weights)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # a step past CHUNK_BYTES of gate-up output: in chunks of tokens (three here)
            real_chunk = moe_grouped_mm.CHUNK_BYTES
            moe_grouped_mm.CHUNK_BYTES = tokens * top_k * w13.shape[1] * x.element_size() // 3
            try:
                got = moe_grouped_mm.grouped_mm_experts(x, w13, w2, ids, weights)
            finally:
                moe_grouped_mm.CHUNK_BYTES = real_chunk
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # experts 4-7 on this rank: only the pairs routed here add
            ep = FusedExperts(num_experts, hidden, inter).to(device, dtype)
            ep.num_local, ep.first_expert = 4, 4
            ep.w13_weight.data, ep.w2_weight.data = w13[4:].clone(), w2[4:].clone()
            got = moe_grouped_mm.grouped_mm_experts(x, w13[4:], w2[4:], ids, weights, 4)
            torch.testing.assert_close(
                got, ep.forward_reference(x, ids, weights), atol=tol, rtol=tol
            )
    check_fp8(device)
    check_dispatch(device)


def check_fp8(device: str) -> None:
    """FP8 experts: the scaled grouped GEMM's result is the W8A8 math's, whole, in chunks,
    and on a rank holding half the experts; and close to the 16-bit activations' result."""
    from cadence.ops import moe_grouped_mm
    from cadence.quant.fp8_experts import quantize_experts

    hidden, inter, num_experts = 48, 32, 8
    w13 = torch.randn(num_experts, 2 * inter, hidden, device=device) * 0.2
    w2 = torch.randn(num_experts, hidden, inter, device=device) * 0.2
    q13, s13 = quantize_experts(w13)
    q2, s2 = quantize_experts(w2)
    assert moe_grouped_mm.usable(
        torch.empty(1, hidden, device=device).bfloat16(), q13, s13, None, None
    )
    for tokens, top_k in ((1, 2), (37, 3), (600, 2)):
        x = torch.randn(tokens, hidden, device=device).bfloat16()
        logits = torch.randn(tokens, num_experts, device=device)
        logits[:, 6:] -= 100.0  # experts 6 and 7 never chosen
        weights = torch.softmax(logits, 1).topk(top_k, dim=1).values.bfloat16()
        ids = logits.topk(top_k, dim=1).indices
        want = fp8_reference(x, q13, s13, q2, s2, ids, weights)
        # (the products sum in another order: a bf16 output may round the other way, and
        # so may an e4m3 activation downstream of it, a 1/16 step; a GPU's FP8 tensor cores
        # also accumulate in their own precision)
        near = 3e-2 * want.abs().max().item()
        scales = dict(w13_scale=s13, w2_scale=s2)
        got = moe_grouped_mm.grouped_mm_experts(x, q13, q2, ids, weights, **scales)
        torch.testing.assert_close(got, want, atol=near, rtol=0)
        # the same experts with 16-bit activations (the dequantized weights): quantizing
        # the activations moves the result by a few percent of its largest value
        dense = fp8_reference_16bit(x, q13, s13, q2, s2, ids, weights)
        torch.testing.assert_close(got, dense, atol=0.1 * dense.abs().max().item(), rtol=0)
        real_chunk = moe_grouped_mm.CHUNK_BYTES
        moe_grouped_mm.CHUNK_BYTES = tokens * top_k * 2 * inter * 2 // 3
        try:  # in chunks of tokens (three here)
            got = moe_grouped_mm.grouped_mm_experts(x, q13, q2, ids, weights, **scales)
        finally:
            moe_grouped_mm.CHUNK_BYTES = real_chunk
        torch.testing.assert_close(got, want, atol=near, rtol=0)
        # experts 4-7 on this rank
        half = fp8_reference(x, q13[4:], s13[4:], q2[4:], s2[4:], ids, weights, first_expert=4)
        got = moe_grouped_mm.grouped_mm_experts(
            x, q13[4:], q2[4:], ids, weights, 4, w13_scale=s13[4:], w2_scale=s2[4:]
        )
        torch.testing.assert_close(got, half, atol=near, rtol=0)


def check_dispatch(device: str) -> None:
    """An entry with "grouped_mm" sends experts without biases down the grouped GEMM (FP8
    ones under bf16 activations); biased ones keep the Triton GEMMs; without the flag
    nothing changes."""
    from cadence.ops import fused_moe, moe_grouped_mm, moe_tiles
    from cadence.quant.fp8_experts import quantize_experts

    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    x = torch.randn(20, 48, device=device, dtype=dtype)
    w13 = torch.randn(8, 64, 48, device=device, dtype=dtype) * 0.2
    w2 = torch.randn(8, 48, 32, device=device, dtype=dtype) * 0.2
    ids = torch.rand(20, 8, device=device).topk(2, dim=1).indices
    weights = torch.rand(20, 2, device=device, dtype=dtype)
    seen, real, real_config = [], moe_grouped_mm.grouped_mm_experts, moe_tiles.config
    entry = moe_tiles.default_config(20, 2, 8)

    def recording(*args, **scales):  # (which calls came, and whether they had scales)
        seen.append(scales.get("w13_scale") is not None)
        return real(*args, **scales)

    moe_grouped_mm.grouped_mm_experts = recording
    try:
        moe_tiles.config = lambda *args: entry
        want = fused_moe.fused_experts(x, w13, w2, ids, weights)  # (the Triton GEMMs)
        moe_tiles.config = lambda *args: {**entry, "grouped_mm": True}
        got = fused_moe.fused_experts(x, w13, w2, ids, weights)
        assert seen == [False]
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        q13, s13 = quantize_experts(w13)
        q2, s2 = quantize_experts(w2)
        fused_moe.fused_experts(x.bfloat16(), q13, q2, ids, weights.bfloat16(), s13, s2)
        assert seen == [False, True]  # FP8 experts under bf16 activations: the scaled GEMM
        fused_moe.fused_experts(x.half(), q13, q2, ids, weights.half(), s13, s2)
        bias13 = torch.zeros(8, 64, device=device, dtype=dtype)
        bias2 = torch.zeros(8, 48, device=device, dtype=dtype)
        fused_moe.fused_experts(x, w13, w2, ids, weights, w13_bias=bias13, w2_bias=bias2)
        assert len(seen) == 2  # FP8 under fp16 activations, and biases: the Triton GEMMs
    finally:
        moe_grouped_mm.grouped_mm_experts, moe_tiles.config = real, real_config


def test_grouped_mm_experts_under_the_interpreter():
    check_all_under_interpreter("test_moe_grouped_mm")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_mm_experts_on_cuda():
    check_all("cuda")
