"""A mixture of experts' expert MLPs as two grouped GEMMs in Triton, with no host sync (so a
decode step's forward can be captured in a CUDA graph).

The step's (token, slot) pairs, T * k of them, are sorted by expert on the device and each
expert's run is padded to a multiple of BLOCK_M rows (`align`):

    sorted_pairs   [P_max]   pair index at each padded row (T * k where padding)
    block_expert   [P_max / BLOCK_M]   the expert whose rows a block of BLOCK_M holds (-1:
                             past the last expert's run: the program returns at once)

P_max = T * k + min(E, T * k) * (BLOCK_M - 1) bounds every routing, so the shapes depend on T alone.
Then, per block of rows and tile of columns, one kernel:

    first GEMM    inter[row] = x[pair // k] @ w13[e]^T           (rows in sorted order)
    (SiLU-and-mul on inter: fused.silu_and_mul)
    second GEMM   out[pair]  = weight[pair] * act[row] @ w2[e]^T  (rows back in pair order)

and out [T, k, H] summed over k. An expert that receives no token has no block: its
weights are never read, so at batch 1 a step reads only the chosen experts' weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops import fused


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,  # [rows of A, K]
    w_ptr,  # [E, N, K]
    out_ptr,  # [rows of out, N]
    sorted_pairs_ptr,  # [P_max] int64
    block_expert_ptr,  # [P_max / BLOCK_M] int64
    weights_ptr,  # [T * k] routing weights (SCALE only)
    num_pairs,  # T * k: a sorted row naming it is padding
    N,
    K,
    stride_a,
    stride_we,
    stride_wn,
    stride_out,
    TOP_K: tl.constexpr,
    A_BY_TOKEN: tl.constexpr,  # A's row is the pair's token (first GEMM), else the sorted row
    OUT_BY_PAIR: tl.constexpr,  # out's row is the pair (second GEMM), else the sorted row
    SCALE: tl.constexpr,  # multiply each row by its pair's routing weight
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32: exact against torch)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + rows)
    real = pairs < num_pairs
    if A_BY_TOKEN:
        a_rows = pairs // TOP_K
    else:
        a_rows = rows
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w_ptr + expert * stride_we
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        a = tl.load(
            a_ptr + a_rows[:, None].to(tl.int64) * stride_a + (k0 + ks)[None, :],
            mask=real[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + cols[None, :].to(tl.int64) * stride_wn + (k0 + ks)[:, None],
            mask=col_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
    if SCALE:
        acc *= tl.load(weights_ptr + pairs, mask=real, other=0.0).to(tl.float32)[:, None]
    if OUT_BY_PAIR:
        out_rows = pairs
    else:
        out_rows = rows
    tl.store(
        out_ptr + out_rows[:, None].to(tl.int64) * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=real[:, None] & col_ok[None, :],
    )


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs [P_max], block_expert [P_max / block_m]) for expert ids [T, k], on the
    device, in ops of static shape (no host sync)."""
    flat = ids.flatten()
    num_pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert
    sorted_experts = flat[order]
    # a pair's rank within its expert: its sorted index less the experts before it
    rank = (
        torch.arange(num_pairs, device=device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    )
    # (at most min(E, pairs) experts get any pair, each padded by under a block)
    max_rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    max_rows = -(-max_rows // block_m) * block_m
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int64, device=device)
    sorted_pairs[(padded_end - padded)[sorted_experts] + rank] = order
    starts = torch.arange(0, max_rows, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_pairs, block_expert


def _config(num_pairs: int) -> dict:
    """Tile sizes: small row blocks where few pairs reach each expert (decode)."""
    block_m = 16 if num_pairs <= 512 else 64
    return dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, num_warps=4)


def _launch(a, w, out, sorted_pairs, block_expert, weights, num_pairs, top_k, **flags):
    cfg = _config(num_pairs)
    n, k = w.shape[1], w.shape[2]
    grid = (block_expert.numel(), triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_gemm_kernel[grid](
        a,
        w,
        out,
        sorted_pairs,
        block_expert,
        weights,
        num_pairs,
        n,
        k,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        TOP_K=top_k,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        **flags,
        **cfg,
    )


def fused_experts(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]: gate rows, then up
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T, k] expert ids
    weights: torch.Tensor,  # [T, k] routing weights
) -> torch.Tensor:
    """sum_k weights[t, k] * down(silu(gate) * up)(x[t]) by expert ids[t, k]: [T, H]."""
    tokens, top_k = ids.shape
    num_pairs = tokens * top_k
    if not num_pairs:
        return torch.zeros_like(x)
    num_experts, two_i, _ = w13.shape
    block_m = _config(num_pairs)["BLOCK_M"]
    sorted_pairs, block_expert = align(ids, num_experts, block_m)
    x = x.contiguous()
    inter = torch.empty((sorted_pairs.numel(), two_i), dtype=x.dtype, device=x.device)
    flat_weights = weights.flatten().contiguous()
    common = (sorted_pairs, block_expert, flat_weights, num_pairs, top_k)
    _launch(x, w13, inter, *common, A_BY_TOKEN=True, OUT_BY_PAIR=False, SCALE=False)
    act = fused.silu_and_mul(inter)  # (padding rows: whatever they held, never read back)
    out = torch.empty((num_pairs, w2.shape[1]), dtype=x.dtype, device=x.device)
    _launch(act, w2, out, *common, A_BY_TOKEN=False, OUT_BY_PAIR=True, SCALE=True)
    return out.view(tokens, top_k, -1).sum(dim=1)
