"""The Triton mixture-of-experts kernels (cadence/ops/fused_moe.py, moe_routing.py, and the
per-pair GEMVs of moe_pairs.py) equal the per-expert torch path (cadence/models/moe.py):
random routings with experts that get no token and experts that get many, one token (a
decode) to many, float32 and 16-bit, FP8 experts, GPT-OSS's experts (biases, clamped
SwiGLU), and a rank that holds only some of the experts (expert parallelism); a tile
entry's "pairs" tiles send fused_experts down the GEMVs, and tiles that order their
programs by groups of row blocks compute the same. On a CPU
they run under Triton's interpreter in a child process (TRITON_INTERPRET is read at
import)."""

from __future__ import annotations

import pytest
import torch
from interpreter_helpers import check_all_under_interpreter

pytest.importorskip("triton", reason="triton is not installed")


def check_routing(device: str) -> None:
    from cadence.models.moe import route
    from cadence.ops import moe_routing

    # topk_softmax: torch's softmax, top-k and renormalisation, in one kernel
    logits = torch.randn(37, 10, device=device)
    for renormalize in (False, True):
        want_w, want_ids = route(logits.cpu(), 3, renormalize)
        got_w, got_ids = moe_routing.topk_softmax(logits, 3, renormalize)
        assert got_ids.tolist() == want_ids.tolist()
        torch.testing.assert_close(got_w.cpu(), want_w, atol=1e-6, rtol=1e-5)
    # (weights in the activations' dtype: rounded once, from float32, as .to() does)
    want_w, _ = route(logits.cpu(), 3, True, torch.float16)
    got_w, _ = moe_routing.topk_softmax(logits, 3, True, torch.float16)
    assert got_w.dtype == torch.float16 and torch.equal(got_w.cpu(), want_w)
    for parallel in (False, True):  # one program, and the three launches of a prefill
        check_align(device, parallel)
    # the three launches by default past PARALLEL_PAIRS: 3,000 pairs over 60 experts
    assert moe_routing.PARALLEL_PAIRS < 3000
    check_align_many(device, torch.rand(500, 60, device=device).topk(6, dim=1).indices, 60, 16)


def check_align(device: str, parallel: bool) -> None:
    from cadence.ops import moe_routing

    # align: every pair once, each expert's run padded to the row block, blocks labelled
    ids = torch.tensor([[3, 1], [3, 0], [1, 3]], device=device)
    sorted_pairs, block_expert = moe_routing.align(ids, 8, 4, parallel=parallel)
    rows = sorted_pairs.tolist()
    assert sorted(p for p in rows if p < 6) == list(range(6))
    assert block_expert.tolist()[:3] == [0, 1, 3] and set(block_expert.tolist()[3:]) == {-1}
    for block, expert in enumerate(block_expert.tolist()[:3]):
        pairs = [p for p in rows[block * 4 : block * 4 + 4] if p < 6]
        assert pairs and all(ids.flatten()[p] == expert for p in pairs)
    # many pairs (more than one chunk, and than one program of the three launches),
    # experts not a power of two
    ids = torch.rand(200, 60, device=device).topk(6, dim=1).indices
    check_align_many(device, ids, 60, 16, parallel=parallel)
    # Mixtral's few experts, each with many pairs
    ids = torch.rand(700, 8, device=device).topk(2, dim=1).indices
    check_align_many(device, ids, 8, 64, parallel=parallel)
    # a rank holding experts 2 and 3 only: pairs routed elsewhere get no row
    ids = torch.tensor([[3, 1], [3, 0], [1, 3]], device=device)
    sorted_pairs, block_expert = moe_routing.align(ids, 2, 4, first_expert=2, parallel=parallel)
    assert sorted(p for p in sorted_pairs.tolist() if p < 6) == [0, 2, 5]
    assert block_expert.tolist()[0] == 1 and set(block_expert.tolist()[1:]) == {-1}
    ids = torch.rand(300, 8, device=device).topk(3, dim=1).indices
    sorted_pairs, block_expert = moe_routing.align(ids, 4, 16, first_expert=4, parallel=parallel)
    flat = ids.flatten().tolist()
    here = [p for p, e in enumerate(flat) if e >= 4]
    assert sorted(p for p in sorted_pairs.tolist() if p < len(flat)) == here
    for block, expert in enumerate(block_expert.tolist()):
        pairs = [p for p in sorted_pairs.tolist()[block * 16 : block * 16 + 16] if p < len(flat)]
        assert all(flat[p] == expert + 4 for p in pairs) and (expert >= 0 or not pairs)


def check_align_many(device, ids, experts: int, block_m: int, parallel=None) -> None:
    """Every pair in exactly one row, each row block's pairs all its expert's, runs padded
    to whole blocks in expert order, and padding rows only where no pair is."""
    from cadence.ops import moe_routing

    sorted_pairs, block_expert = moe_routing.align(ids, experts, block_m, parallel=parallel)
    num_pairs = ids.numel()
    rows, owners, flat = sorted_pairs.tolist(), block_expert.tolist(), ids.flatten().tolist()
    assert sorted(p for p in rows if p < num_pairs) == list(range(num_pairs))
    assert all(p == num_pairs for p in rows if p >= num_pairs)
    labelled = [e for e in owners if e >= 0]
    assert labelled == sorted(labelled) and owners == labelled + [-1] * (
        len(owners) - len(labelled)
    )
    for expert in range(experts):  # each run: as many blocks as its pairs need
        count = flat.count(expert)
        assert labelled.count(expert) == -(-count // block_m)
    for block, expert in enumerate(owners):
        pairs = [p for p in rows[block * block_m : (block + 1) * block_m] if p < num_pairs]
        assert all(flat[p] == expert for p in pairs) and (expert >= 0 or not pairs)


def check_all(device: str) -> None:
    from cadence.models.moe import FusedExperts, route
    from cadence.ops import fused_moe, moe_pairs
    from cadence.quant.fp8_experts import quantize_experts

    torch.manual_seed(0)
    check_routing(device)
    hidden, inter, num_experts = 48, 40, 8  # widths that are not tile multiples
    experts = FusedExperts(num_experts, hidden, inter).to(device)
    experts.w13_weight.data.normal_(std=0.2)
    experts.w2_weight.data.normal_(std=0.2)
    cases = [(torch.float32, 1e-4), (torch.float16, 1e-2)]
    if device == "cuda":  # (the interpreter's tl.dot has no bf16)
        cases.append((torch.bfloat16, 3e-2))
    for dtype, tol in cases:
        for tokens, top_k in ((1, 1), (1, 2), (5, 2), (33, 3)):
            x = torch.randn(tokens, hidden, device=device, dtype=dtype)
            logits = torch.randn(tokens, num_experts, device=device)
            logits[:, 5:] -= 100.0  # experts 5-7 never chosen
            weights, ids = route(logits, top_k, renormalize=True)
            ref = FusedExperts(num_experts, hidden, inter).to(device, dtype)
            ref.w13_weight.data.copy_(experts.w13_weight)
            ref.w2_weight.data.copy_(experts.w2_weight)
            want = ref.forward_reference(x, ids, weights)
            w13, w2 = ref.w13_weight, ref.w2_weight
            got = fused_moe.fused_experts(x, w13, w2, ids, weights)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # (the one-column tile, slow under the interpreter, in one case)
            every = dtype == torch.float32 and tokens == 5
            for tiles in PAIR_TILES if every else PAIR_TILES[:2]:
                got = moe_pairs.pair_experts(x, w13, w2, ids, weights, tiles=tiles)
                torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # experts 4-7 on this rank, 0-3 on another: only the pairs routed here add
            ep = FusedExperts(num_experts, hidden, inter).to(device, dtype)
            ep.num_local, ep.first_expert = 4, 4
            ep.w13_weight.data, ep.w2_weight.data = w13[4:].clone(), w2[4:].clone()
            got = fused_moe.fused_experts(x, w13[4:], w2[4:], ids, weights, None, None, 4, 8)
            want_ep = ep.forward_reference(x, ids, weights)
            torch.testing.assert_close(got, want_ep, atol=tol, rtol=tol)
            got = moe_pairs.pair_experts(x, w13[4:], w2[4:], ids, weights, None, None, 4)
            torch.testing.assert_close(got, want_ep, atol=tol, rtol=tol)
            # FP8 experts: the same e4m3 weights and scales on both paths
            q13, s13 = quantize_experts(w13)
            q2, s2 = quantize_experts(w2)
            ref.w13_weight.data, ref.w2_weight.data = q13, q2
            ref.w13_scale, ref.w2_scale = s13, s2
            want = ref.forward_reference(x, ids, weights)
            got = fused_moe.fused_experts(x, q13, q2, ids, weights, s13, s2)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            got = moe_pairs.pair_experts(x, q13, q2, ids, weights, s13, s2, tiles=PAIR_TILES[0])
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        check_biased_clamped(device, dtype, tol)
    empty = fused_moe.fused_experts(x[:0], w13, w2, ids[:0], weights[:0])  # no tokens
    assert empty.shape == (0, hidden)
    assert moe_pairs.pair_experts(x[:0], w13, w2, ids[:0], weights[:0]).shape == (0, hidden)
    check_pairs_entry_dispatch(device)
    check_row_block_groups(device)
    check_routed(device)


def check_pairs_entry_dispatch(device: str) -> None:
    """A step whose tile entry has "pairs" tiles takes the GEMVs with them."""
    from cadence.ops import fused_moe, moe_pairs, moe_tiles

    seen = []
    real_pairs, real_config = moe_pairs.pair_experts, moe_tiles.config

    def spy(*args, tiles=None):
        seen.append(tiles)
        return real_pairs(*args, tiles=tiles)

    entry = {**moe_tiles.default_config(2, 2, 8), "pairs": PAIR_TILES[1]}
    moe_pairs.pair_experts = spy
    moe_tiles.config = lambda *args: entry
    try:
        x = torch.randn(2, 48, device=device)
        w13, w2 = torch.randn(8, 80, 48, device=device), torch.randn(8, 48, 40, device=device)
        ids = torch.tensor([[1, 6], [6, 2]], device=device)
        weights = torch.rand(2, 2, device=device)
        got = fused_moe.fused_experts(x, w13, w2, ids, weights)
    finally:
        moe_pairs.pair_experts, moe_tiles.config = real_pairs, real_config
    assert seen == [PAIR_TILES[1]]
    want = fused_moe.fused_experts(x, w13, w2, ids, weights)  # (the grouped GEMMs)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def check_routed(device: str) -> None:
    """The per-pair GEMVs routing for themselves (softmax, top k, renormalisation in the
    gated GEMV's programs) equal route() then the experts: 10 experts (not a power of
    two), k of 1-3, with and without renormalisation, weights rounded to 16 bits or kept
    in float32, a rank holding half the experts, FP8 experts; and fused_experts_routed
    takes that path only where a tile entry has "pairs"."""
    from cadence.models.moe import FusedExperts, route
    from cadence.ops import fused_moe, moe_pairs, moe_tiles
    from cadence.quant.fp8_experts import quantize_experts

    hidden, inter, num_experts = 48, 40, 10
    for dtype, tol in [(torch.float32, 1e-4), (torch.float16, 1e-2)]:
        ref = FusedExperts(num_experts, hidden, inter).to(device, dtype)
        for p in ref.parameters():
            p.data.normal_(std=0.2)
        w13, w2 = ref.w13_weight, ref.w2_weight
        cases = [(1, 1, False, dtype), (1, 2, True, dtype), (5, 3, True, torch.float32)]
        cases.append((9, 2, False, dtype))
        for i, (tokens, top_k, renormalize, wdtype) in enumerate(cases):
            x = torch.randn(tokens, hidden, device=device, dtype=dtype)
            logits = torch.randn(tokens, num_experts, device=device)
            weights, ids = route(logits, top_k, renormalize, wdtype)
            want = ref.forward_reference(x, ids, weights)
            tiles = PAIR_TILES[i % 2]
            got = moe_pairs.pair_experts_routed(
                x, logits, top_k, renormalize, wdtype, w13, w2, tiles=tiles
            )
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # experts 5-9 on this rank: only the pairs routed here add
            ep = FusedExperts(num_experts, hidden, inter).to(device, dtype)
            ep.num_local, ep.first_expert = 5, 5
            ep.w13_weight.data, ep.w2_weight.data = w13[5:].clone(), w2[5:].clone()
            got = moe_pairs.pair_experts_routed(
                x, logits, top_k, renormalize, wdtype, w13[5:], w2[5:], None, None, 5, tiles
            )
            torch.testing.assert_close(
                got, ep.forward_reference(x, ids, weights), atol=tol, rtol=tol
            )
        q13, s13 = quantize_experts(w13)
        q2, s2 = quantize_experts(w2)
        fp8 = FusedExperts(num_experts, hidden, inter).to(device, dtype)
        fp8.w13_weight.data, fp8.w2_weight.data, fp8.w13_scale, fp8.w2_scale = q13, q2, s13, s2
        want = fp8.forward_reference(x, ids, weights)
        got = moe_pairs.pair_experts_routed(x, logits, 2, False, dtype, q13, q2, s13, s2)
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # the dispatch: a "pairs" entry routes in the GEMVs, else topk_softmax and the GEMMs
    seen, real_routed, real_config = [], moe_pairs.pair_experts_routed, moe_tiles.config
    entry = moe_tiles.default_config(9, 2, num_experts)
    try:
        moe_pairs.pair_experts_routed = lambda *a, **k: (
            seen.append(k["tiles"]) or real_routed(*a, **k)
        )
        for with_pairs in (True, False):
            pick = {**entry, "pairs": PAIR_TILES[0]} if with_pairs else entry
            moe_tiles.config = lambda *args, pick=pick: pick
            got = fused_moe.fused_experts_routed(x, logits, 2, False, dtype, w13, w2)
            torch.testing.assert_close(got, want_plain(ref, x, logits), atol=tol, rtol=tol)
    finally:
        moe_pairs.pair_experts_routed, moe_tiles.config = real_routed, real_config
    assert seen == [PAIR_TILES[0]]


def want_plain(ref, x, logits):
    from cadence.models.moe import route

    weights, ids = route(logits, 2, False, x.dtype)
    return ref.forward_reference(x, ids, weights)


def check_row_block_groups(device: str) -> None:
    """Tiles with GROUP_M order the programs by groups of row blocks (one block, four with a
    shorter last group, more than there are): every (row block, column tile) is still
    computed once, with the same result as the default order; and the same again with the
    rows aligned by the three launches a prefill takes."""
    from cadence.models.moe import FusedExperts
    from cadence.ops import fused_moe, moe_routing, moe_tiles

    # two experts, each token to both: 33 rows each, 3 row blocks each, no padding block,
    # so the last, shorter group of four holds real rows
    x = torch.randn(33, 48, device=device)
    w13, w2 = torch.randn(2, 80, 48, device=device), torch.randn(2, 48, 40, device=device)
    ids = torch.tensor([[0, 1], [1, 0]], device=device).repeat(17, 1)[:33]
    weights = torch.rand(33, 2, device=device)
    narrow = dict(BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=2)  # 3 column tiles each
    real_config, real_parallel = moe_tiles.config, moe_routing.PARALLEL_PAIRS
    try:
        moe_tiles.config = lambda *args: dict(BLOCK_M=16, gated=narrow, down=narrow)
        want = fused_moe.fused_experts(x, w13, w2, ids, weights)
        for group_m in (1, 4, 64):
            tile = dict(narrow, GROUP_M=group_m)
            moe_tiles.config = lambda *args, t=tile: dict(BLOCK_M=16, gated=t, down=dict(t))
            got = fused_moe.fused_experts(x, w13, w2, ids, weights)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        moe_routing.PARALLEL_PAIRS = 0
        got = fused_moe.fused_experts(x, w13, w2, ids, weights)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    finally:
        moe_tiles.config, moe_routing.PARALLEL_PAIRS = real_config, real_parallel
    ref = FusedExperts(2, 48, 40).to(device)
    ref.w13_weight.data, ref.w2_weight.data = w13, w2
    torch.testing.assert_close(want, ref.forward_reference(x, ids, weights), atol=1e-4, rtol=1e-4)


def _tile(block_n: int, block_k: int) -> dict:
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=2)


# GEMV tiles for widths 48 and 40: one K pass (64) and several (16), columns cut short,
# and one column a down program (each slot's row alone)
PAIR_TILES = [
    {"gated": _tile(32, 64), "down": _tile(32, 64)},
    {"gated": _tile(16, 16), "down": _tile(64, 16)},
    {"gated": _tile(4, 64), "down": _tile(1, 64)},
]


def check_biased_clamped(device: str, dtype: torch.dtype, tol: float) -> None:
    """GPT-OSS's experts: a bias on both GEMMs (the down one before the routing weight) and
    the clamped gate, with a limit most gate and up values cross."""
    from cadence.models.moe import FusedExperts, route
    from cadence.ops import fused_moe, moe_pairs

    hidden, inter, num_experts = 48, 40, 8
    ref = FusedExperts(num_experts, hidden, inter, bias=True, clamped_swiglu=(1.702, 0.3))
    ref = ref.to(device, dtype)
    for p in ref.parameters():
        p.data.normal_(std=0.3)
    for tokens, top_k in ((1, 2), (9, 3)):
        x = torch.randn(tokens, hidden, device=device, dtype=dtype)
        weights, ids = route(torch.randn(tokens, num_experts, device=device), top_k, True)
        want = ref.forward_reference(x, ids, weights)
        got = fused_moe.fused_experts(
            x, ref.w13_weight, ref.w2_weight, ids, weights,
            w13_bias=ref.w13_bias, w2_bias=ref.w2_bias, clamped=(1.702, 0.3),
        )  # fmt: skip
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        got = moe_pairs.pair_experts(
            x, ref.w13_weight, ref.w2_weight, ids, weights, None, None, 0,
            ref.w13_bias, ref.w2_bias, (1.702, 0.3), tiles=PAIR_TILES[1],
        )  # fmt: skip
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_fused_moe_under_the_interpreter():
    check_all_under_interpreter("test_fused_moe")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_moe_on_cuda():
    check_all("cuda")
