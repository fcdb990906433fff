"""FP8 experts' two grouped GEMMs with both operands in FP8 (W8A8) and swapped, for the step
sizes whose tile entry has "w8a8" tiles (benchmarks/moe_w8a8_sweep.py): decodes, where
each expert gets a few rows.

fused_moe.py's GEMMs put an expert's rows on the MMA's M side. Hopper's FP8 MMA (wgmma)
needs 64 rows there, so with the 16-32-row blocks of a decode Triton takes 16-bit mma.sync
and widens every e4m3 weight in registers first: whole layers on the H200 read FP8 experts
at 2.2-3.1 TB/s that way, where bf16 experts stream at ~4 (this way: 2.9-4.0). Here each program computes the transposed tile

    out^T [BLOCK_N, BLOCK_M] = w[e][columns] @ a[rows]^T

so the weight columns are the M side (BLOCK_N: 64 or more) and the rows the N side
(BLOCK_M: 16 and up), and both operands reach the FP8 tensor cores as they lie in memory.

`a` is e4m3 with a float32 scale a row (cadence/ops/fp8_rows.py): the tokens for the gated
GEMM, the activation for the down one. Each output is its row's scale times its column's
times the FP8 dot, whose partial sums are promoted to float32 after every BLOCK_K (not left
in the tensor cores' narrower accumulator across all of K). Rows are aligned as for
fused_moe (moe_routing.align: each expert's run padded to BLOCK_M) and round as there: gate
and up to the activations' dtype before silu(gate) * up (moe_epilogue.gated_activation),
the down GEMM's output scaled by the routing weight in float32 before its one rounding. Only
experts without biases or a clamped gate (`usable`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops import fp8_rows
from cadence.ops.fused import gdc_wait, pdl
from cadence.ops.moe_epilogue import gated_activation
from cadence.ops.moe_routing import block_rows


@triton.jit(do_not_specialize=["num_blocks"])
def _w8a8_gemm_kernel(
    a_ptr,  # [rows of A, K] e4m3
    a_scale_ptr,  # [rows of A] float32
    w_ptr,  # [E, N (or 2N: gate rows, then up), K] e4m3
    w_scale_ptr,  # [E, rows of w] float32
    out_ptr,  # [rows of out, N]
    sorted_pairs_ptr,  # [P_max] int64
    block_expert_ptr,  # [P_max / BLOCK_M] int64
    weights_ptr,  # [T * k] routing weights (ROUTE_SCALE only)
    num_pairs,  # T * k: a sorted row naming it is padding
    num_blocks,  # row blocks (P_max / BLOCK_M)
    N,  # output columns (gated: the intermediate size)
    K,
    stride_a,
    stride_we,
    stride_wn,
    stride_se,
    stride_out,
    top_k,
    GATED: tl.constexpr,  # first GEMM: silu(gate) * up of weight rows n and N + n
    ROUTE_SCALE: tl.constexpr,  # second GEMM: scale by the routing weight, store by pair
    BLOCK_M: tl.constexpr,  # rows (the MMA's N side)
    BLOCK_N: tl.constexpr,  # output columns (the MMA's M side)
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    # every row block of a column tile, then the next tile (a decode's rows are few)
    pid = tl.program_id(0)
    block, tile_n = pid % num_blocks, pid // num_blocks
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    rows, pairs, real, a_rows = block_rows(
        block, sorted_pairs_ptr, num_pairs, top_k, GATED, BLOCK_M
    )
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + a_rows[None, :].to(tl.int64) * stride_a + ks[:, None]  # a^T [K, rows]
    w_tile = w_ptr + expert * stride_we + cols[:, None].to(tl.int64) * stride_wn + ks[None, :]
    up_offset = N * stride_wn  # (gated: the up rows sit N rows below the gate rows)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        a = tl.load(a_tile + k0, mask=k_ok[:, None] & real[None, :], other=0.0)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_tile + k0, mask=w_mask, other=0.0)
        acc += tl.dot(w, a, max_num_imprecise_acc=BLOCK_K)
        if GATED:
            w_up = tl.load(w_tile + up_offset + k0, mask=w_mask, other=0.0)
            acc_up += tl.dot(w_up, a, max_num_imprecise_acc=BLOCK_K)
    # (a padding row's scale reads zero: its row of A was not loaded either)
    a_scales = tl.load(a_scale_ptr + a_rows, mask=real, other=0.0)[None, :]
    w_scales = w_scale_ptr + expert * stride_se + cols
    acc *= tl.load(w_scales, mask=col_ok, other=0.0)[:, None] * a_scales
    if GATED:
        acc_up *= tl.load(w_scales + N, mask=col_ok, other=0.0)[:, None] * a_scales
        acc = gated_activation(acc, acc_up, 1.0, 1.0, out_ptr.dtype.element_ty, False)
        out_rows = rows
    else:
        out_rows = pairs
    if ROUTE_SCALE:
        acc *= tl.load(weights_ptr + pairs, mask=real, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + out_rows[None, :].to(tl.int64) * stride_out + cols[:, None],
        acc.to(out_ptr.dtype.element_ty),
        mask=real[None, :] & col_ok[:, None],
    )


def usable(
    x: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w13_bias: torch.Tensor | None,
    clamped: tuple[float, float] | None,
) -> bool:
    """Whether these experts can take the W8A8 GEMMs: FP8 weights (with their scales) under
    16-bit activations (the row quantizer's input), no biases, SiLU's gate."""
    return (
        w13_scale is not None
        and x.dtype in (torch.bfloat16, torch.float16)
        and w13_bias is None
        and clamped is None
    )


def launch(
    a: torch.Tensor,  # [rows, K] e4m3
    a_scale: torch.Tensor,  # [rows] (or [rows, 1]) float32
    w: torch.Tensor,  # [E, N or 2N, K] e4m3
    w_scale: torch.Tensor,  # [E, N or 2N] float32
    out: torch.Tensor,  # [rows of out, N]
    sorted_pairs: torch.Tensor,
    block_expert: torch.Tensor,
    weights: torch.Tensor,  # [T * k]
    num_pairs: int,
    top_k: int,
    tile: dict,  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    *,
    gated: bool,
) -> None:
    """One swapped W8A8 grouped GEMM over the aligned rows: the gated one (x by token ->
    the activation by sorted row) or the down one (the activation -> each pair's output,
    scaled by its routing weight). benchmarks/moe_w8a8_sweep.py times it tile by tile."""
    num_blocks = block_expert.numel()
    n = out.shape[1]
    use_pdl = pdl(a.device)
    _w8a8_gemm_kernel[(num_blocks * triton.cdiv(n, tile["BLOCK_N"]),)](
        a, a_scale, w, w_scale, out, sorted_pairs, block_expert, weights, num_pairs,
        num_blocks, n, w.shape[2], a.stride(0), w.stride(0), w.stride(1), w_scale.stride(0),
        out.stride(0), top_k, GATED=gated, ROUTE_SCALE=not gated, PDL=use_pdl,
        launch_pdl=use_pdl, **tile,
    )  # fmt: skip


def expert_gemms(
    x: torch.Tensor,  # [T, H] 16-bit
    w13: torch.Tensor,  # [E, 2I, H] e4m3
    w13_scale: torch.Tensor,  # [E, 2I]
    w2: torch.Tensor,  # [E, H, I] e4m3
    w2_scale: torch.Tensor,  # [E, H]
    out: torch.Tensor,  # [T * k, H]: each pair's weighted output (rows of no pair untouched)
    aligned: tuple,  # (sorted_pairs, block_expert, flat weights, T * k, k)
    tiles: dict,  # the entry's "w8a8": BLOCK_M, "gated" and "down" tiles
) -> None:
    """Both GEMMs of fused_moe.fused_experts, W8A8, into `out`: the tokens quantized per row,
    the gated GEMM's activation (16-bit) quantized per row for the down GEMM."""
    sorted_pairs = aligned[0]
    xq, x_scale = fp8_rows.quantize_rows(x)
    act = torch.empty((sorted_pairs.numel(), w2.shape[2]), dtype=x.dtype, device=x.device)
    block_m = tiles["BLOCK_M"]
    launch(xq, x_scale, w13, w13_scale, act, *aligned, dict(BLOCK_M=block_m, **tiles["gated"]),
           gated=True)  # fmt: skip
    # (padding rows hold whatever act's memory held: quantized too, and never read)
    act_q, act_scale = fp8_rows.quantize_rows(act)
    launch(act_q, act_scale, w2, w2_scale, out, *aligned, dict(BLOCK_M=block_m, **tiles["down"]),
           gated=False)  # fmt: skip
