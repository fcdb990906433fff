"""A mixture of experts' expert MLPs as two grouped GEMMs in Triton, with no host sync (so a
decode step's forward can be captured in a CUDA graph).

The step's (token, slot) pairs are sorted by expert and each expert's run padded to a
multiple of BLOCK_M rows (moe_routing.align). Then, per block of rows and tile of columns:

    gated GEMM   act[row] = silu(x[pair // k] @ gate[e]^T) * (x[pair // k] @ up[e]^T)
                 (rows in sorted order; gate and up tiles side by side, one pass over x)
    down GEMM    out[pair] = weight[pair] * act[row] @ w2[e]^T   (rows back in pair order)

and out [T, k, H] summed over k. An expert that receives no token has no block: its
weights are never read, so at batch 1 a step reads only the chosen experts' weights.

GPT-OSS's experts add a bias to each GEMM (HAS_BIAS: before the gate and before the
routing weight) and gate with its clamped SwiGLU (ACT_CLAMPED: g = min(gate, limit),
(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)) instead of silu(gate) * up.

FP8 experts (`--quantization fp8`) keep e4m3 weights with a float32 scale per output
channel and expert; the tiles are widened to the activations' dtype in registers (W8A16:
the bytes a step reads halve, the products stay 16-bit) and each column scaled at the end;
where a step's entry has "w8a8" tiles, they take cadence/ops/moe_w8a8.py's GEMMs instead
(both operands FP8, swapped so that a few rows an expert still reach FP8 tensor cores).
Tile sizes come from moe_tiles (the H200 sweep's table); where the table says so for a
step's size (an entry's "pairs"), the step takes cadence/ops/moe_pairs.py's two GEMV
launches instead of the four here (fused_experts_routed: with the routing inside them);
where an entry says "grouped_mm" (large steps), the experts take torch's grouped GEMM
(cadence/ops/moe_grouped_mm.py; FP8 ones its W8A8 scaled GEMM) instead of these.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops import moe_grouped_mm, moe_pairs, moe_routing, moe_tiles, moe_w8a8
from cadence.ops.fused import gdc_wait, pdl
from cadence.ops.moe_epilogue import gated_activation, sum_slots_kernel
from cadence.ops.moe_routing import block_rows


@triton.jit
def _program_tile(pid, num_blocks, num_tiles, group_m):
    """The (row block, column tile) program `pid` computes. Programs start in pid order, so
    this decides what is in flight together: group_m row blocks across every column tile,
    then the next group_m (row blocks first within a group). group_m = num_blocks walks
    every row block of a column tile before the next tile (fine while A is small); a group
    of a few blocks keeps its rows of A and its experts' weights in L2 through the group's
    column tiles (prefill, where A is far larger than L2)."""
    per_group = group_m * num_tiles
    first = (pid // per_group) * group_m
    size = tl.minimum(num_blocks - first, group_m)
    within = pid % per_group
    return first + within % size, within // size


# (group_m and the block count not specialized: one variant serves every ordering and step)
@triton.jit(do_not_specialize=["num_blocks", "group_m"])
def _grouped_gemm_kernel(
    a_ptr,  # [rows of A, K]
    w_ptr,  # [E, N (or 2N: gate rows, then up), K]
    scale_ptr,  # [E, rows of w] float32 (W_SCALE only)
    bias_ptr,  # [E, rows of w] (HAS_BIAS only)
    out_ptr,  # [rows of out, N]
    sorted_pairs_ptr,  # [P_max] int64
    block_expert_ptr,  # [P_max / BLOCK_M] int64
    weights_ptr,  # [T * k] routing weights (ROUTE_SCALE only)
    num_pairs,  # T * k: a sorted row naming it is padding
    num_blocks,  # row blocks (P_max / BLOCK_M)
    group_m,  # row blocks a group of programs walks every column tile of (_program_tile)
    N,  # output columns (gated: the intermediate size)
    K,
    stride_a,
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    stride_out,
    top_k,  # pairs a token has
    alpha,  # ACT_CLAMPED's sigmoid slope
    limit,  # ACT_CLAMPED's clamp
    GATED: tl.constexpr,  # first GEMM: silu(gate) * up of rows n and N + n
    ROUTE_SCALE: tl.constexpr,  # second GEMM: scale rows by their routing weight, store by pair
    W_SCALE: tl.constexpr,  # FP8 weights: widen each tile, scale each column at the end
    HAS_BIAS: tl.constexpr,  # add the expert's bias to each output column
    ACT_CLAMPED: tl.constexpr,  # gated: GPT-OSS's clamped SwiGLU instead of silu(gate) * up
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32: exact against torch)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    block, tile_n = _program_tile(tl.program_id(0), num_blocks, tl.cdiv(N, BLOCK_N), group_m)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    rows, pairs, real, a_rows = block_rows(
        block, sorted_pairs_ptr, num_pairs, top_k, GATED, BLOCK_M
    )
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_base = a_ptr + a_rows[:, None].to(tl.int64) * stride_a
    w_tile = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
    up_offset = N * stride_wn  # (gated: the up rows sit N rows below the gate rows)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        a = tl.load(a_base + (k0 + ks)[None, :], mask=real[:, None] & k_ok[None, :], other=0.0)
        w_mask = col_ok[None, :] & k_ok[:, None]
        w = tl.load(w_tile + k0, mask=w_mask, other=0.0)
        if W_SCALE:
            w = w.to(a.dtype)
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
        if GATED:
            w_up = tl.load(w_tile + up_offset + k0, mask=w_mask, other=0.0)
            if W_SCALE:
                w_up = w_up.to(a.dtype)
            acc_up += tl.dot(a, w_up, input_precision=DOT_PRECISION)
    if W_SCALE:
        scales = scale_ptr + expert * stride_se + cols
        acc *= tl.load(scales, mask=col_ok, other=0.0)[None, :]
        if GATED:
            acc_up *= tl.load(scales + N, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        biases = bias_ptr + expert * stride_be + cols
        acc += tl.load(biases, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(biases + N, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = gated_activation(acc, acc_up, alpha, limit, out_ptr.dtype.element_ty, ACT_CLAMPED)
        out_rows = rows
    else:
        out_rows = pairs
    if ROUTE_SCALE:
        acc *= tl.load(weights_ptr + pairs, mask=real, other=0.0).to(tl.float32)[:, None]
    tl.store(
        out_ptr + out_rows[:, None].to(tl.int64) * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=real[:, None] & col_ok[None, :],
    )


def sum_slots(pairs: torch.Tensor, tokens: int, top_k: int) -> torch.Tensor:
    """pairs [T * k, H] (contiguous) summed over each token's k slots: [T, H]. One launch
    instead of torch's reduction (a few microseconds a layer at batch 1)."""
    hidden = pairs.shape[1]
    out = torch.empty((tokens, hidden), dtype=pairs.dtype, device=pairs.device)
    block = min(1024, triton.next_power_of_2(hidden))
    use_pdl = pdl(pairs.device)
    sum_slots_kernel[(tokens, triton.cdiv(hidden, block))](
        pairs, pairs, pairs, out, hidden, top_k,
        GATHER=False, BLOCK=block, PDL=use_pdl, num_warps=4, launch_pdl=use_pdl,
    )  # fmt: skip
    return out


def launch_gemm(
    a,
    w,
    scale,
    out,
    sorted_pairs,
    block_expert,
    weights,
    num_pairs,
    top_k,
    tile,
    bias=None,
    clamped: tuple[float, float] | None = None,
    **flags,
):
    """One grouped GEMM over the aligned rows (`flags`: GATED, ROUTE_SCALE) with `tile`
    (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, and optionally GROUP_M: row blocks a
    group of programs walks every column tile of; absent, every row block of a column tile
    runs before the next tile); `bias` [E, rows of w] where the experts have one, `clamped`
    (alpha, limit) for GPT-OSS's gate. benchmarks/moe_tile_sweep.py and
    moe_group_sweep.py time it tile by tile."""
    n = out.shape[1]
    tile = dict(tile)
    num_blocks = block_expert.numel()
    group_m = tile.pop("GROUP_M", None) or num_blocks
    grid = (num_blocks * triton.cdiv(n, tile["BLOCK_N"]),)
    use_pdl = pdl(a.device)
    _grouped_gemm_kernel[grid](
        a,
        w,
        scale if scale is not None else w,
        bias if bias is not None else w,
        out,
        sorted_pairs,
        block_expert,
        weights,
        num_pairs,
        num_blocks,
        min(group_m, num_blocks),
        n,
        w.shape[2],
        a.stride(0),
        w.stride(0),
        w.stride(1),
        scale.stride(0) if scale is not None else 0,
        bias.stride(0) if bias is not None else 0,
        out.stride(0),
        top_k,
        *(clamped or (1.0, 1.0)),
        W_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        ACT_CLAMPED=clamped is not None,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        PDL=use_pdl,
        launch_pdl=use_pdl,
        **flags,
        **tile,
    )


def fused_experts(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]: gate rows, then up
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T, k] expert ids (global; this rank's are first_expert + [0, E))
    weights: torch.Tensor,  # [T, k] routing weights
    w13_scale: torch.Tensor | None = None,  # [E, 2I] float32, FP8 weights only
    w2_scale: torch.Tensor | None = None,  # [E, H] float32, FP8 weights only
    first_expert: int = 0,
    global_experts: int | None = None,  # every rank's together (None: this rank's are all)
    w13_bias: torch.Tensor | None = None,  # [E, 2I]
    w2_bias: torch.Tensor | None = None,  # [E, H]
    clamped: tuple[float, float] | None = None,  # (alpha, limit): GPT-OSS's gate
) -> torch.Tensor:
    """sum_k weights[t, k] * down(silu(gate) * up)(x[t]) over the experts ids[t, k] this
    rank holds: [T, H] in x's dtype (with biases and the clamped gate where given)."""
    tokens, top_k = ids.shape
    num_pairs = tokens * top_k
    num_experts, two_i, hidden = w13.shape
    if not num_pairs:
        return torch.zeros_like(x)
    all_local = (global_experts or num_experts) == num_experts
    cfg = _tiles(x, w13, top_k, global_experts)
    if "pairs" in cfg:
        return moe_pairs.pair_experts(
            x, w13, w2, ids, weights, w13_scale, w2_scale, first_expert,
            w13_bias, w2_bias, clamped, tiles=cfg["pairs"],
        )  # fmt: skip
    if cfg.get("grouped_mm") and moe_grouped_mm.usable(x, w13, w13_scale, w13_bias, clamped):
        return moe_grouped_mm.grouped_mm_experts(
            x, w13, w2, ids, weights, first_expert, w13_scale=w13_scale, w2_scale=w2_scale
        )
    w8a8 = cfg.get("w8a8") if moe_w8a8.usable(x, w13_scale, w13_bias, clamped) else None
    block_m = (w8a8 or cfg)["BLOCK_M"]
    sorted_pairs, block_expert = moe_routing.align(ids, num_experts, block_m, first_expert)
    x = x.contiguous()
    flat_weights = weights.flatten().contiguous()
    common = (sorted_pairs, block_expert, flat_weights, num_pairs, top_k)
    # pairs routed to another rank's experts get no row: their outputs must read zero
    alloc = torch.empty if all_local else torch.zeros
    out = alloc((num_pairs, hidden), dtype=x.dtype, device=x.device)
    if w8a8:
        moe_w8a8.expert_gemms(x, w13, w13_scale, w2, w2_scale, out, common, w8a8)
        return sum_slots(out, tokens, top_k)
    act = torch.empty((sorted_pairs.numel(), two_i // 2), dtype=x.dtype, device=x.device)
    tile = dict(BLOCK_M=block_m, **cfg["gated"])
    launch_gemm(
        x, w13, w13_scale, act, *common, tile, w13_bias, clamped, GATED=True, ROUTE_SCALE=False
    )
    tile = dict(BLOCK_M=block_m, **cfg["down"])
    launch_gemm(act, w2, w2_scale, out, *common, tile, w2_bias, GATED=False, ROUTE_SCALE=True)
    return sum_slots(out, tokens, top_k)


def fused_experts_routed(
    x: torch.Tensor,  # [T, H]
    logits: torch.Tensor,  # [T, E_all] router logits
    top_k: int,
    renormalize: bool,
    weight_dtype: torch.dtype,  # routing weights' dtype (moe.route's out_dtype)
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    first_expert: int = 0,
    global_experts: int | None = None,
) -> torch.Tensor:
    """fused_experts after plain softmax top-k routing of `logits`: where the tile table
    sends a step to the per-pair GEMVs, their gated GEMV routes too (one launch fewer);
    else moe_routing.topk_softmax, then fused_experts."""
    cfg = _tiles(x, w13, top_k, global_experts)
    if "pairs" in cfg and x.shape[0]:
        return moe_pairs.pair_experts_routed(
            x, logits, top_k, renormalize, weight_dtype, w13, w2, w13_scale, w2_scale,
            first_expert, tiles=cfg["pairs"],
        )  # fmt: skip
    weights, ids = moe_routing.topk_softmax(logits, top_k, renormalize, weight_dtype)
    return fused_experts(
        x, w13, w2, ids, weights, w13_scale, w2_scale, first_expert, global_experts
    )  # fmt: skip


def _tiles(x: torch.Tensor, w13: torch.Tensor, top_k: int, global_experts: int | None) -> dict:
    """The tile table's entry for this step (moe_tiles.config), looked up by the pairs
    this rank's experts get: a share of the step's under expert parallelism."""
    num_experts, two_i, hidden = w13.shape
    local_tokens = -(-x.shape[0] * num_experts // (global_experts or num_experts))
    shape = (num_experts, hidden, two_i // 2)
    return moe_tiles.config(x.device, w13.dtype, shape, local_tokens, top_k)
