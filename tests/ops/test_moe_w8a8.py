"""FP8 experts through the swapped W8A8 grouped GEMMs (cadence/ops/moe_w8a8.py) equal the
W8A8 math done expert by expert: tokens and activations quantized per row, one token to
many, experts that get no token and experts whose rows fill several row blocks, widths that
are not tile multiples, a rank holding half the experts; and fused_experts takes them only
where the step's tile entry has "w8a8" tiles and the experts allow it (FP8 weights under
16-bit activations, no biases). On a CPU the kernels run under Triton's interpreter in a
child process."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter
from moe_fp8_reference import fp8_reference, fp8_reference_16bit

pytest.importorskip("triton", reason="triton is not installed")


def _tile(block_n: int, block_k: int, stages: int = 2) -> dict:
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=stages)


# (hidden 48 and intermediate 40 below: K runs cut short by the masks, column tiles too)
W8A8_TILES = [
    dict(BLOCK_M=16, gated=_tile(16, 32), down=_tile(32, 32)),
    dict(BLOCK_M=32, gated=_tile(64, 64), down=_tile(16, 64)),
]
# on a GPU, the sizes the sweep tries: the weights 64+ columns (wgmma's M side)
GPU_TILES = [
    dict(BLOCK_M=16, gated=_tile(64, 128, 4), down=_tile(64, 256, 3)),
    dict(BLOCK_M=64, gated=_tile(128, 128, 3), down=_tile(64, 128, 3)),
]


def forced(entry_w8a8: dict | None):
    """moe_tiles.config answering one entry (with these "w8a8" tiles, or none) for any step."""
    from cadence.ops import moe_tiles

    entry = moe_tiles.default_config(8, 2, 8)
    return lambda *args: {**entry, "w8a8": entry_w8a8} if entry_w8a8 else entry


def check_all(device: str) -> None:
    from cadence.ops import moe_tiles
    from cadence.quant.fp8_experts import quantize_experts

    torch.manual_seed(0)
    hidden, inter, num_experts = 48, 40, 8
    q13, s13 = quantize_experts(torch.randn(num_experts, 2 * inter, hidden, device=device) * 0.2)
    q2, s2 = quantize_experts(torch.randn(num_experts, hidden, inter, device=device) * 0.2)
    tiles = W8A8_TILES + (GPU_TILES if device == "cuda" else [])
    # (the interpreter rounds float32 to bf16 its own way: bf16 on a GPU only)
    dtypes = [torch.bfloat16, torch.float16] if device == "cuda" else [torch.float16]
    real_config = moe_tiles.config
    try:
        for dtype in dtypes:
            check_cases(device, dtype, tiles, q13, s13, q2, s2)
    finally:
        moe_tiles.config = real_config
    check_dispatch(device)


def check_cases(device, dtype, tiles, q13, s13, q2, s2) -> None:
    from cadence.ops import fused_moe, moe_tiles

    num_experts, hidden = q2.shape[:2]
    for i, (tokens, top_k) in enumerate(((1, 1), (1, 2), (5, 2), (37, 3), (70, 2))):
        x = torch.randn(tokens, hidden, device=device).to(dtype)
        logits = torch.randn(tokens, num_experts, device=device)
        logits[:, 6:] -= 100.0  # experts 6 and 7 never chosen
        if tokens == 70:
            logits[:, 0] += 100.0  # expert 0 gets every token: rows over several blocks
        weights = torch.softmax(logits, 1).topk(top_k, dim=1).values.to(dtype)
        ids = logits.topk(top_k, dim=1).indices
        want = fp8_reference(x, q13, s13, q2, s2, ids, weights)
        # the interpreter's dots are exact: only rounding differs. A GPU's sum in another
        # order can round a bf16 output, and the e4m3 activation downstream of it, the other
        # way (a 1/16 step), and its FP8 tensor cores accumulate in their own precision
        near = (3e-2 if device == "cuda" else 2e-3) * want.abs().max().item()
        for w8a8 in tiles:
            moe_tiles.config = forced(w8a8)
            got = fused_moe.fused_experts(x, q13, q2, ids, weights, s13, s2)
            assert got.dtype == dtype
            torch.testing.assert_close(got, want, atol=near, rtol=0)
        # quantizing the activations moves the result by a few percent at most
        dense = fp8_reference_16bit(x, q13, s13, q2, s2, ids, weights)
        torch.testing.assert_close(
            got.float(), dense.float(), atol=0.1 * dense.abs().max().item(), rtol=0
        )
        # experts 4-7 on this rank, 0-3 on another: only the pairs routed here add
        moe_tiles.config = forced(tiles[i % len(tiles)])
        half = fp8_reference(x, q13[4:], s13[4:], q2[4:], s2[4:], ids, weights, 4)
        got = fused_moe.fused_experts(x, q13[4:], q2[4:], ids, weights, s13[4:], s2[4:], 4, 8)
        torch.testing.assert_close(got, half, atol=near, rtol=0)


def check_dispatch(device: str) -> None:
    """ "w8a8" tiles send FP8 experts under 16-bit activations to moe_w8a8; 16-bit experts,
    float32 activations and biased FP8 experts keep fused_moe's GEMMs; without the tiles
    nothing changes."""
    from cadence.ops import fused_moe, moe_tiles, moe_w8a8
    from cadence.quant.fp8_experts import quantize_experts

    x = torch.randn(9, 48, device=device)
    w13 = torch.randn(8, 64, 48, device=device) * 0.2
    w2 = torch.randn(8, 48, 32, device=device) * 0.2
    q13, s13 = quantize_experts(w13)
    q2, s2 = quantize_experts(w2)
    ids = torch.rand(9, 8, device=device).topk(2, dim=1).indices
    weights = torch.rand(9, 2, device=device)
    seen, real, real_config = [], moe_w8a8.expert_gemms, moe_tiles.config

    def recording(*args):  # (the tiles each call came with)
        seen.append(args[-1])
        return real(*args)

    moe_w8a8.expert_gemms = recording
    try:
        moe_tiles.config = forced(W8A8_TILES[0])
        fused_moe.fused_experts(x.half(), q13, q2, ids, weights.half(), s13, s2)
        assert seen == [W8A8_TILES[0]]
        fused_moe.fused_experts(x.half(), w13.half(), w2.half(), ids, weights.half())
        fused_moe.fused_experts(x, q13, q2, ids, weights, s13, s2)  # (float32: W8A16)
        bias13, bias2 = torch.zeros(8, 64, device=device), torch.zeros(8, 48, device=device)
        fused_moe.fused_experts(
            x.half(), q13, q2, ids, weights.half(), s13, s2, w13_bias=bias13, w2_bias=bias2
        )
        moe_tiles.config = forced(None)
        fused_moe.fused_experts(x.half(), q13, q2, ids, weights.half(), s13, s2)
        assert len(seen) == 1
    finally:
        moe_w8a8.expert_gemms, moe_tiles.config = real, real_config


def check_graph_replay() -> None:
    """Captured in a CUDA graph (as a decode step is), the W8A8 path replayed with new tokens
    and a new routing gives the eager result: nothing of the routing is fixed at capture."""
    from cadence.ops import fused_moe, moe_tiles
    from cadence.quant.fp8_experts import quantize_experts

    hidden, inter, num_experts, tokens = 256, 128, 16, 24
    q13, s13 = quantize_experts(torch.randn(num_experts, 2 * inter, hidden, device="cuda") * 0.1)
    q2, s2 = quantize_experts(torch.randn(num_experts, hidden, inter, device="cuda") * 0.1)

    def routing(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
        scores = torch.rand(tokens, num_experts, device="cuda", generator=g)
        weights, ids = scores.topk(4, dim=1)
        return x, ids, weights.bfloat16()

    static = [t.clone() for t in routing(0)]
    run = lambda: fused_moe.fused_experts(  # noqa: E731
        static[0], q13, q2, static[1], static[2], s13, s2
    )
    real_config = moe_tiles.config
    moe_tiles.config = forced(GPU_TILES[0])
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for seed in (1, 2):
            for held, new in zip(static, routing(seed)):
                held.copy_(new)
            graph.replay()
            torch.testing.assert_close(out, run(), atol=0, rtol=0)
    finally:
        moe_tiles.config = real_config


def test_w8a8_experts_under_the_interpreter():
    check_all_under_interpreter("test_moe_w8a8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_w8a8_experts_on_cuda():
    check_all("cuda")
    check_graph_replay()
