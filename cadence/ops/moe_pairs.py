"""A mixture of experts' expert MLPs for steps of a few tokens: one program per (token, slot)
pair and tile of columns, so nothing is sorted or padded (no alignment launch) and each
token's slots are summed inside the second kernel (no summing launch).

    gated GEMV   act[pair] = silu(x[pair // k] @ gate[e]^T) * (x[pair // k] @ up[e]^T)
                 grid (pairs, columns of I / BLOCK_N); e = ids[pair]
    down GEMV    out[t] = sum over slots j of weight[t, j] * act[t * k + j] @ w2[ids[t, j]]^T
                 grid (tokens, columns of H / BLOCK_N), every slot's rows in one program;
                 each slot's output rounded to the activations' dtype before the sum, as
                 fused_moe's path rounds each pair's output before its slot sum

Two launches a layer where the grouped path (cadence/ops/fused_moe.py) takes four (align,
gated GEMM, down GEMM, slot sum). At batch 1 a step reads the k chosen experts either way;
what differs is the launches and that a GEMV program streams whole weight rows (no 16-row
MMA tile of which 15 rows are padding). A pair routed to the same expert as another is
read once per pair, so the grouped path wins once tokens share experts: which path a step
takes is the tile table's choice per batch (an entry {"kernel": "pairs", ...} from
benchmarks/moe_pairs_sweep.py), never a guess here.

Same options as the grouped path: FP8 weights (e4m3 with a float32 scale per expert and
row, widened in registers), GPT-OSS's biases and clamped SwiGLU, and a rank holding only
experts [first, first + E) (a pair routed elsewhere adds nothing).

pair_experts_routed takes the router logits instead of ids and weights: each gated program
ranks its token's experts itself (moe_routing.softmax_top_k, the routing kernel's own code)
and the column-0 programs write the pair's id and weight for the down GEMV, so a layer
that routes plainly (softmax top-k) runs two launches where it ran three.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait, pdl
from cadence.ops.moe_epilogue import gated_activation
from cadence.ops.moe_routing import softmax_top_k

# Where the table has no pairs entry but a caller asks for the path (tests, the sweep's
# baseline): a GEMV tile that keeps a program's accumulators in registers.
DEFAULT_TILES = {
    "gated": dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=2),
    "down": dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=2),
}


# (not specialized on k or the expert count: one compiled variant serves every model)
@triton.jit(do_not_specialize=["top_k", "first_expert", "num_experts"])
def _pairs_gated_kernel(
    x_ptr,  # [T, K]
    w_ptr,  # [E, 2N, K]: gate rows, then up
    scale_ptr,  # [E, 2N] float32 (W_SCALE only)
    bias_ptr,  # [E, 2N] (HAS_BIAS only)
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    ids_ptr,  # [T * k] global expert ids (ROUTE: written here)
    act_ptr,  # [T * k, N]
    N,  # the intermediate size
    K,  # hidden
    stride_x,
    stride_act,
    top_k,
    first_expert,
    num_experts,  # this rank's
    alpha,  # ACT_CLAMPED's sigmoid slope
    limit,  # ACT_CLAMPED's clamp
    logits_ptr,  # [T, E_ALL] router logits (ROUTE only)
    weights_ptr,  # [T * k] routing weights, written here (ROUTE only)
    stride_logits,
    num_logits,  # every rank's experts (ROUTE only)
    W_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT_CLAMPED: tl.constexpr,
    ROUTE: tl.constexpr,  # route here (softmax top-k of the logits) instead of reading ids
    ROUTE_K: tl.constexpr,  # ROUTE: top_k, and the three below
    RENORMALIZE: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    pair = tl.program_id(0)
    token = pair // top_k
    if ROUTE:  # every program of the pair ranks its token's experts; column 0's write them
        lanes = tl.arange(0, E_PAD)
        row = logits_ptr + token.to(tl.int64) * stride_logits + lanes
        x = tl.load(row, mask=lanes < num_logits, other=-float("inf")).to(tl.float32)
        top_w, top_i = softmax_top_k(x[None, :], num_logits, ROUTE_K, K_PAD, E_PAD, RENORMALIZE)
        mine = tl.arange(0, K_PAD)[None, :] == pair % top_k
        routed = tl.sum(tl.where(mine, top_i, 0))
        if tl.program_id(1) == 0:
            tl.store(ids_ptr + pair, routed)
            weight = tl.sum(tl.where(mine, top_w, 0.0))
            tl.store(weights_ptr + pair, weight.to(weights_ptr.dtype.element_ty))
        expert = routed.to(tl.int64) - first_expert
    else:
        expert = tl.load(ids_ptr + pair).to(tl.int64) - first_expert
    if (expert >= 0) & (expert < num_experts):  # (another rank's: its act row is never read)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        ks = tl.arange(0, BLOCK_K)
        x_row = x_ptr + token.to(tl.int64) * stride_x
        w_rows = w_ptr + expert * stride_we + cols[:, None].to(tl.int64) * stride_wn + ks[None, :]
        up_offset = N * stride_wn  # (the up rows sit N rows below the gate rows)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = k0 + ks < K
            a = tl.load(x_row + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            w_mask = col_ok[:, None] & k_ok[None, :]
            acc += tl.load(w_rows + k0, mask=w_mask, other=0.0).to(tl.float32) * a
            acc_up += tl.load(w_rows + up_offset + k0, mask=w_mask, other=0.0).to(tl.float32) * a
        gate = tl.sum(acc, axis=1)
        up = tl.sum(acc_up, axis=1)
        if W_SCALE:
            scales = scale_ptr + expert * stride_se + cols
            gate *= tl.load(scales, mask=col_ok, other=0.0)
            up *= tl.load(scales + N, mask=col_ok, other=0.0)
        if HAS_BIAS:
            biases = bias_ptr + expert * stride_be + cols
            gate += tl.load(biases, mask=col_ok, other=0.0).to(tl.float32)
            up += tl.load(biases + N, mask=col_ok, other=0.0).to(tl.float32)
        dtype = act_ptr.dtype.element_ty
        out = gated_activation(gate, up, alpha, limit, dtype, ACT_CLAMPED)
        tl.store(act_ptr + pair.to(tl.int64) * stride_act + cols, out.to(dtype), mask=col_ok)


@triton.jit(do_not_specialize=["top_k", "first_expert", "num_experts"])
def _pairs_down_kernel(
    act_ptr,  # [T * k, K]
    w_ptr,  # [E, N, K]
    scale_ptr,  # [E, N] float32 (W_SCALE only)
    bias_ptr,  # [E, N] (HAS_BIAS only)
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    ids_ptr,  # [T * k] global expert ids
    weights_ptr,  # [T * k] routing weights
    out_ptr,  # [T, N]
    N,  # hidden
    K,  # the intermediate size
    stride_act,
    stride_out,
    top_k,
    first_expert,
    num_experts,
    W_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    K_PAD: tl.constexpr,  # k rounded up to a power of two
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # Every slot's rows at once (row r: slot r // BLOCK_N, column r % BLOCK_N), so one
    # program has all k experts' weight tiles in flight rather than one expert's at a time.
    if PDL:
        gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, K_PAD * BLOCK_N)
    slot = rows // BLOCK_N
    cols = tl.program_id(1) * BLOCK_N + rows % BLOCK_N
    pair = token * top_k + slot
    expert = tl.load(ids_ptr + pair, mask=slot < top_k, other=0).to(tl.int64) - first_expert
    row_ok = (slot < top_k) & (expert >= 0) & (expert < num_experts) & (cols < N)
    expert = tl.where(row_ok, expert, 0)
    ks = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + expert[:, None] * stride_we + cols[:, None].to(tl.int64) * stride_wn
    a_rows = act_ptr + pair[:, None] * stride_act
    acc = tl.zeros((K_PAD * BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        mask = row_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + (k0 + ks)[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += w * tl.load(a_rows + (k0 + ks)[None, :], mask=mask, other=0.0).to(tl.float32)
    value = tl.sum(acc, axis=1)
    if W_SCALE:
        value *= tl.load(scale_ptr + expert * stride_se + cols, mask=row_ok, other=0.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + cols, mask=row_ok, other=0.0)
        value += bias.to(tl.float32)
    value *= tl.load(weights_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
    # each slot's output rounded to the activations' dtype, then the slots summed in float32
    dtype = out_ptr.dtype.element_ty
    value = tl.where(row_ok, value, 0.0).to(dtype).to(tl.float32)
    total = tl.sum(tl.reshape(value, (K_PAD, BLOCK_N)), axis=0)
    out_cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + token * stride_out + out_cols, total.to(dtype), mask=out_cols < N)


def _expert_args(w: torch.Tensor, scale, bias) -> tuple:
    """A kernel's weight arguments: the stacked weights, their scales and biases (the
    weights' pointer where absent: never read) and the four strides."""
    return (
        w,
        scale if scale is not None else w,
        bias if bias is not None else w,
        w.stride(0),
        w.stride(1),
        scale.stride(0) if scale is not None else 0,
        bias.stride(0) if bias is not None else 0,
    )


def _expert_flags(scale, bias) -> dict:
    return dict(W_SCALE=scale is not None, HAS_BIAS=bias is not None)


def pair_experts(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]: gate rows, then up
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T, k] expert ids (global; this rank's are first_expert + [0, E))
    weights: torch.Tensor,  # [T, k] routing weights
    w13_scale: torch.Tensor | None = None,  # [E, 2I] float32, FP8 weights only
    w2_scale: torch.Tensor | None = None,  # [E, H] float32, FP8 weights only
    first_expert: int = 0,
    w13_bias: torch.Tensor | None = None,  # [E, 2I]
    w2_bias: torch.Tensor | None = None,  # [E, H]
    clamped: tuple[float, float] | None = None,  # (alpha, limit): GPT-OSS's gate
    tiles: dict | None = None,  # {"gated": tile, "down": tile}; DEFAULT_TILES if None
) -> torch.Tensor:
    """fused_moe.fused_experts' result, [T, H] in x's dtype, by two GEMV launches (module
    docstring). Each tile is BLOCK_N, BLOCK_K, num_warps, num_stages."""
    experts = (w13, w2, w13_scale, w2_scale, first_expert, w13_bias, w2_bias, clamped)
    flat_ids, flat_weights = ids.flatten().contiguous(), weights.flatten().contiguous()
    return _two_gemvs(x, *experts, flat_ids, flat_weights, ids.shape[1], tiles)


def pair_experts_routed(
    x: torch.Tensor,  # [T, H]
    logits: torch.Tensor,  # [T, E_all] router logits (every rank's experts)
    top_k: int,
    renormalize: bool,
    weight_dtype: torch.dtype,  # what routing weights are rounded to (moe.route's out_dtype)
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    first_expert: int = 0,
    tiles: dict | None = None,
) -> torch.Tensor:
    """pair_experts after moe.route(logits, top_k, renormalize, weight_dtype), with the
    routing (softmax, top k, renormalisation) done by the gated GEMV's programs themselves:
    one launch a layer fewer. Plain softmax top-k routing only, experts without biases."""
    tokens = x.shape[0]
    ids = torch.empty(tokens * top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(tokens * top_k, dtype=weight_dtype, device=x.device)
    experts = (w13, w2, w13_scale, w2_scale, first_expert, None, None, None)
    return _two_gemvs(x, *experts, ids, weights, top_k, tiles, (logits, renormalize))


def _two_gemvs(
    x, w13, w2, w13_scale, w2_scale, first_expert, w13_bias, w2_bias, clamped,
    flat_ids, flat_weights, top_k, tiles, route=None,
):  # fmt: skip
    """The gated GEMV then the down GEMV over the T * k pairs; `route` (logits,
    renormalize): the gated GEMV writes flat_ids and flat_weights itself."""
    tokens = x.shape[0]
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    tiles = tiles or DEFAULT_TILES
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if not tokens:
        return out
    x = x.contiguous()
    act = torch.empty((tokens * top_k, inter), dtype=x.dtype, device=x.device)
    use_pdl = pdl(x.device)
    gated, down = tiles["gated"], tiles["down"]
    common = dict(PDL=use_pdl, launch_pdl=use_pdl)
    logits, renormalize = route if route else (flat_ids, False)
    routing = dict(ROUTE=False, ROUTE_K=1, RENORMALIZE=False, K_PAD=1, E_PAD=1)
    if route:
        e_pad = triton.next_power_of_2(logits.shape[1])
        k_pad = triton.next_power_of_2(top_k)
        routing = dict(ROUTE=True, ROUTE_K=top_k, RENORMALIZE=renormalize, K_PAD=k_pad, E_PAD=e_pad)
    _pairs_gated_kernel[(tokens * top_k, triton.cdiv(inter, gated["BLOCK_N"]))](
        x,
        *_expert_args(w13, w13_scale, w13_bias),
        flat_ids,
        act,
        inter,
        hidden,
        x.stride(0),
        act.stride(0),
        top_k,
        first_expert,
        num_experts,
        *(clamped or (1.0, 1.0)),
        logits,
        flat_weights,
        logits.stride(0) if route else 0,
        logits.shape[1] if route else 0,
        ACT_CLAMPED=clamped is not None,
        **_expert_flags(w13_scale, w13_bias),
        **routing,
        **common,
        **gated,
    )
    _pairs_down_kernel[(tokens, triton.cdiv(hidden, down["BLOCK_N"]))](
        act,
        *_expert_args(w2, w2_scale, w2_bias),
        flat_ids,
        flat_weights,
        out,
        hidden,
        inter,
        act.stride(0),
        out.stride(0),
        top_k,
        first_expert,
        num_experts,
        K_PAD=triton.next_power_of_2(top_k),
        **_expert_flags(w2_scale, w2_bias),
        **common,
        **down,
    )
    return out
