"""Triton matrix-vector products for single-row linear layers (batch-1 decode), with the
elementwise op before them fused in.

At batch 1 a decode step is one pass over the weights: every linear layer is y = W x with
W [N, K] read once from HBM, so its time is its bytes over the bandwidth, and what else
costs is the launches between them: a layer is RMSNorm, qkv, rotary + K/V write,
attention, o_proj, RMSNorm, gate_up, SiLU-and-mul, down (plus cuBLAS's split-K reduce),
each launch a few microseconds of ramp-up and tail. Here each program owns BLOCK_N output
rows, streams their K columns in BLOCK_K tiles (a 2-D fp32 accumulator, reduced once at the
end) and writes BLOCK_N outputs: no split-K, no second kernel; and the input x is formed
on the fly from what the previous layer left:

    gemv(x, W)                         W x
    rms_norm_gemv(x, res, w_n, eps, W) W rmsnorm(x + res) and x + res: the decoder's
                                       residual add and norm folded into the projection
    rms_norm_gemv(..., keep_normed=True)   also rmsnorm(x + res) itself, rounded as the
                                       RMSNorm module rounds (a mixture's router: its
                                       experts take the normed row too)
    silu_mul_gemv(gu, W)               W (silu(gate) * up), gu = [gate | up]: the MLP's
                                       activation folded into the down projection

The norm's scale 1/rms(x) is a scalar of the row, so it is applied after the dot
(y = rstd * W (w_n * x), every program summing x^2 as it streams x): one pass, and
the normalised activation is not rounded to 16 bits before the product, so the result is
within rounding of the unfused layers, not bit-equal to them. (16-bit dtypes only: float32
runs keep the unfused layers, whose tokens tests compare with transformers exactly.)

CUDA only; which projections use it is `FUSED_PROJECTIONS` (models/fused.py asks).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait, pdl

# Launch settings, module constants so a sweep can set them (benchmarks/kernel_sweep.py).
# On an H200 at Llama-3.1-8B's shapes the plain gemv measured (alone, CUDA graph replay):
# o_proj [4096 x 4096] 7.8 us against cuBLAS's 10.4; qkv and down tied with cuBLAS, gate_up
# and the LM head lost by ~4 %. Inside a decode step o_proj took 11.5 us against ~12.5.
# (Alone, a layer's weights can stay in the 50 MB L2; in a step every byte is from HBM.)
BLOCK_N = 16
BLOCK_K = 1024
NUM_WARPS = 8
NUM_STAGES = 3
# Long rows (down: K = 14,336): fewer rows a program, more programs.
LONG_K = 8192
LONG_BLOCK_N = 8
LONG_NUM_WARPS = 4

# The projections that take these kernels at batch 1; the rest keep cuBLAS and the
# separate norm / activation kernels. CADENCE_GEMV=qkv,o,gate_up,down overrides, to measure
# one choice against another. Measured on an H200 in one run (Llama-3.1-8B shape, bf16,
# batch-1 decode step): o alone 4.51 ms; qkv, o and down (norm and SiLU-and-mul folded in)
# 4.72 ms; all four 5.09 ms. The launches saved do not pay for these kernels' lower
# bandwidth on the big shapes (qkv: 384 programs of 16 rows are ~1.5 waves on 132 SMs, and
# the K loop is not software-pipelined), so only o_proj takes a gemv, and the fused
# prologues wait for a faster kernel. A mixture's router ("router": E x H, 128 x 2,048 on
# Qwen3-30B-A3B) is small enough that the launch is the cost: its norm and residual add
# fold into it, one launch where there were two (models/fused.py norm_router).
_DEFAULT = "o,router"
FUSED_PROJECTIONS = frozenset(
    os.environ.get("CADENCE_GEMV", _DEFAULT).replace(" ", "").split(",")
) - {""}

_PLAIN, _RMS_NORM, _SILU_MUL = 0, 1, 2


@triton.jit
def _gemv_kernel(
    x_ptr,
    res_ptr,
    norm_w_ptr,
    res_out_ptr,
    normed_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    N,
    K,
    stride_wn,
    eps,
    PROLOGUE: tl.constexpr,  # 0: x; 1: rmsnorm(x [+ res]); 2: silu(x[:K]) * x[K:]
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    KEEP_NORMED: tl.constexpr,  # PROLOGUE 1: program 0 also writes rmsnorm(x + res)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    sum_sq = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
        if PROLOGUE == 1:
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + cols, mask=col_ok, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded, as PyTorch
                if pid == 0:  # the residual stream, once
                    tl.store(res_out_ptr + cols, x, mask=col_ok)
            xf = x.to(tl.float32)
            sum_sq += xf * xf
            xf = xf * tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        elif PROLOGUE == 2:
            g = x.to(tl.float32)
            up = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0).to(tl.float32)
            xf = g / (1.0 + tl.exp(-g)) * up
        else:
            xf = x.to(tl.float32)
        # Weights are read exactly once: do not let them push x out of the cache.
        w = tl.load(
            w_rows + cols[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0.0,
            eviction_policy="evict_first",
        )
        acc += w.to(tl.float32) * xf[None, :]
    y = tl.sum(acc, 1)
    if PROLOGUE == 1:
        rstd = tl.math.rsqrt(tl.sum(sum_sq, 0) / K + eps)
        y = y * rstd
        if KEEP_NORMED:  # noqa: SIM102 (a constexpr, then a runtime test: two ifs for Triton)
            if pid == 0:  # a second pass over the row (4-16 KB: cached)
                for k0 in range(0, K, BLOCK_K):
                    cols = k0 + tl.arange(0, BLOCK_K)
                    col_ok = cols < K
                    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
                    if HAS_RESIDUAL:
                        r = tl.load(res_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                        x = (x.to(tl.float32) + r).to(x.dtype)
                    w_n = tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                    # w * (x * rstd).to(dtype), rounded twice as layers.norm.RMSNorm rounds
                    normed = w_n * (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
                    tl.store(normed_ptr + cols, normed.to(x.dtype), mask=col_ok)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    prologue: int,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    normed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n, wk = weight.shape
    if wk != k or weight.stride(1) != 1 or x.shape[0] != 1 or x.stride(-1) != 1:
        raise ValueError(
            f"gemv wants one contiguous row of {k} and a row-major [N, {k}] weight, "
            f"got x {tuple(x.shape)} and weight {tuple(weight.shape)}"
        )
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    long = k >= LONG_K
    block_n = LONG_BLOCK_N if long else BLOCK_N
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x,
        residual if residual is not None else x,
        norm_weight if norm_weight is not None else x,
        res_out if res_out is not None else y,
        normed if normed is not None else y,
        weight,
        bias if bias is not None else weight,
        y,
        n,
        k,
        weight.stride(0),
        eps,
        PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        KEEP_NORMED=normed is not None,
        BLOCK_N=block_n,
        BLOCK_K=BLOCK_K,
        PDL=pdl(x.device),
        num_warps=LONG_NUM_WARPS if long else NUM_WARPS,
        num_stages=NUM_STAGES,
        launch_pdl=pdl(x.device),
    )
    return y, res_out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [1, K] @ weight[N, K]^T (+ bias) -> [1, N], in x's dtype."""
    return _launch(x, weight, bias, weight.shape[1], _PLAIN)[0]


def rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    keep_normed: bool = False,
) -> tuple[torch.Tensor, ...]:
    """(W rmsnorm(x + residual) (+ bias), x + residual) for one row, as RMSNorm then the
    linear layer; without a residual the second value is x itself. `keep_normed`:
    (W rmsnorm(x + residual), rmsnorm(x + residual), x + residual)."""
    normed = torch.empty_like(x) if keep_normed else None
    y, res_out = _launch(
        x, weight, bias, x.shape[-1], _RMS_NORM, residual, norm_weight, eps, normed
    )
    res_out = res_out if res_out is not None else x
    return (y, normed, res_out) if keep_normed else (y, res_out)


def silu_mul_gemv(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """W (silu(gate) * up) (+ bias) for one row gate_up = [gate | up] of width 2K."""
    return _launch(gate_up, weight, bias, gate_up.shape[-1] // 2, _SILU_MUL)[0]
