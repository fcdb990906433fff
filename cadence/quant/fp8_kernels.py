"""The FP8 (e4m3) products of `cadence/quant/fp8.py`.

    quantize_per_token(x)        x [M, K] 16-bit -> (e4m3 [M, K], float32 scales [M, 1]):
                                 each row scaled so its largest magnitude is 448
                                 (cadence/ops/fp8_rows.py, which the MoE GEMMs share)
    scaled_mm(xq, xs, w, ws)     x W^T through torch._scaled_mm (cuBLASLt's FP8 GEMM,
                                 rowwise scales: activations per token, weights per channel)
    fp8_gemv(x, w, ws)           one row of 16-bit activations against e4m3 weights (Triton):
                                 a batch-1 decode step is a pass over the weights, and this
                                 reads them at one byte a weight without a quantization
                                 kernel before it
    fp8_mm(xq, xs, w, ws)        W8A8 on the tensor cores in Triton, for decode batches (the
                                 sweep's winner over cuBLASLt from 8 to 128 rows)

On a CPU the same math runs through torch (its _scaled_mm also takes e4m3 on a CPU), for
the tests; the Triton kernels are CUDA's (and the interpreter's).
"""

from __future__ import annotations

import os

import torch

from cadence.ops.fp8_rows import FP8, FP8_MAX, quantize_rows, quantize_rows_torch

# Triton's interpreter multiplies 16-bit and 8-bit blocks wrongly (3.9): under it the
# kernels' products run in fp32 on the same values.
_INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install may lack triton: the torch paths serve
    triton = None

if triton is not None:

    @triton.jit
    def _gemv_tile(w_rows, row_ok, k0, K, BLOCK_K: tl.constexpr):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols < K)[None, :]
        return tl.load(w_rows + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _gemv_fold(acc, tile, x_ptr, k0, K, BLOCK_K: tl.constexpr):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        return acc + tl.sum(tile.to(tl.float32) * x[None, :], 1)

    @triton.jit
    def _fp8_gemv_kernel(
        x_ptr,
        w_ptr,
        ws_ptr,
        b_ptr,
        y_ptr,
        N,
        K,
        HAS_BIAS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        UNROLL: tl.constexpr,  # 1, 2 or 4
    ):
        # A step at batch 1 is bound by how many weight bytes are in flight: each program
        # issues UNROLL tile loads before it uses the first, and folds each tile into a
        # [BLOCK_N] sum at once (few registers, so several programs fit an SM).
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K * UNROLL):
            t0 = _gemv_tile(w_rows, row_ok, k0, K, BLOCK_K)
            if UNROLL > 1:
                t1 = _gemv_tile(w_rows, row_ok, k0 + BLOCK_K, K, BLOCK_K)
            if UNROLL > 2:
                t2 = _gemv_tile(w_rows, row_ok, k0 + 2 * BLOCK_K, K, BLOCK_K)
                t3 = _gemv_tile(w_rows, row_ok, k0 + 3 * BLOCK_K, K, BLOCK_K)
            acc = _gemv_fold(acc, t0, x_ptr, k0, K, BLOCK_K)
            if UNROLL > 1:
                acc = _gemv_fold(acc, t1, x_ptr, k0 + BLOCK_K, K, BLOCK_K)
            if UNROLL > 2:
                acc = _gemv_fold(acc, t2, x_ptr, k0 + 2 * BLOCK_K, K, BLOCK_K)
                acc = _gemv_fold(acc, t3, x_ptr, k0 + 3 * BLOCK_K, K, BLOCK_K)
        y = acc * tl.load(ws_ptr + rows, mask=row_ok, other=0.0)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


if triton is not None:

    @triton.jit
    def _fp8_mm_kernel(
        xq_ptr,
        xs_ptr,
        w_ptr,
        ws_ptr,
        b_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_ym,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DOT_F32: tl.constexpr,  # the interpreter: products in fp32 on the same values
    ):
        # W8A8 on the tensor cores: e4m3 x e4m3 products, fp32 accumulation, both scales
        # applied once at the end (activations per row, weights per column).
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        n_ok = rn < N
        x_ptrs = xq_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
        w_ptrs = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = rk < K - k0  # a tail tile (K not a multiple of BLOCK_K) reads zeros
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            if DOT_F32:
                acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        xs = tl.load(xs_ptr + rm, mask=m_ok, other=0.0)
        ws = tl.load(ws_ptr + rn, mask=n_ok, other=0.0)
        acc = acc * xs[:, None] * ws[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + rm[:, None] * stride_ym + rn[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=m_ok[:, None] & n_ok[None, :],
        )


# fp8_mm's tiles: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), the sweep's best at
# 32-128 rows on an H200: narrow column tiles for the 4,096- and 6,144-wide projections
# (more programs), wide ones from MM_WIDE_N columns (gate_up's 28,672).
MM_CONFIG = (64, 32, 256, 4, 4)
MM_CONFIG_WIDE = (64, 128, 128, 8, 3)
MM_WIDE_N = 16384


def fp8_mm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """(xq * xs) (w * ws)^T (+ bias) in Triton: xq [M, K] e4m3, xs [M, 1], ws [N]."""
    m, k = xq.shape
    n = w.shape[0]
    block_m, block_n, block_k, warps, stages = config or MM_CONFIG
    block_k = min(block_k, max(32, triton.next_power_of_2(k)))  # small models: narrow K
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _fp8_mm_kernel[grid](
        xq,
        xs,
        w,
        ws,
        bias if bias is not None else ws,
        y,
        m,
        n,
        k,
        y.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_F32=_INTERPRETER,
        num_warps=warps,
        num_stages=stages,
    )
    return y


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16/32-bit weight [N, K] -> (e4m3 [N, K], float32 scale per output channel [N])."""
    q, scale = quantize_rows_torch(w)
    return q, scale.view(-1)


quantize_per_token = quantize_rows  # (its kernel lives in cadence/ops/fp8_rows.py)


def quantize_static(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x scaled by one checkpoint scale (a static activation scheme)."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.reshape(1, 1).expand(x.shape[0], 1).contiguous()


def scaled_mm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    ws_row: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """(xq * xs) (w * ws)^T + bias; xs [M, 1], ws_row [1, N], both float32. On a CPU the
    product is emulated in float32 (torch's CPU kernel takes per-tensor scales only, before
    2.13): the same operands, for tests."""
    if not xq.is_cuda:
        y = ((xq.float() * xs) @ (w.float() * ws_row.reshape(-1, 1)).t()).to(out_dtype)
    else:
        y = torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws_row, out_dtype=out_dtype)
    return y if bias is None else y + bias


# fp8_gemv's tiles: (BLOCK_N, BLOCK_K, UNROLL, num_warps). The sweep's best for all four of
# Llama-3.1-8B's projections on an H200 (benchmarks/fp8_gemm_sweep.py): 65-89 % of HBM
# bandwidth, 1.7-1.8x bf16's cuBLAS.
GEMV_CONFIG = (8, 1024, 2, 4)


def fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """x [1, K] (16-bit) against e4m3 w [N, K] with per-channel scales ws [N]."""
    n, k = w.shape
    block_n, block_k, unroll, warps = config or GEMV_CONFIG
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, block_n),)](
        x,
        w,
        ws,
        bias if bias is not None else ws,
        y,
        n,
        k,
        HAS_BIAS=bias is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        UNROLL=unroll,
        num_warps=warps,
        num_stages=1,
    )
    return y
