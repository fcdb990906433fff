"""The FP8 (e4m3) products of `cadence/quant/fp8.py`.

    quantize_per_token(x)        x [M, K] 16-bit -> (e4m3 [M, K], float32 scales [M, 1]):
                                 each row scaled so its largest magnitude is 448
    scaled_mm(xq, xs, w, ws)     x W^T through torch._scaled_mm (cuBLASLt's FP8 GEMM,
                                 rowwise scales: activations per token, weights per channel)
    fp8_gemv(x, w, ws)           one row of 16-bit activations against e4m3 weights (Triton):
                                 a batch-1 decode step is a pass over the weights, and this
                                 reads them at one byte a weight without a quantization
                                 kernel before it

On a CPU the same math runs through torch (its _scaled_mm also takes e4m3 on a CPU), for
the tests; the Triton kernels are CUDA's (and the interpreter's).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12  # an all-zero row still gets a finite scale

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install may lack triton: the torch paths serve
    triton = None

if triton is not None:

    @triton.jit
    def _quant_row_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        amax = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = tl.maximum(tl.max(amax, 0) / 448.0, 1e-12)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0)
            q = tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)

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
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(
                w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :],
                other=0.0,
                eviction_policy="evict_first",
            )
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, 1) * tl.load(ws_ptr + rows, mask=row_ok, other=0.0)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16/32-bit weight [N, K] -> (e4m3 [N, K], float32 scale per output channel [N])."""
    scale = (w.abs().amax(dim=1).float() / FP8_MAX).clamp(min=MIN_SCALE)
    q = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    if x.is_cuda and triton is not None:
        q = torch.empty((m, k), dtype=FP8, device=x.device)
        s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
        if m:
            block = min(4096, triton.next_power_of_2(k))
            _quant_row_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK=block, num_warps=4)
        return q, s
    s = (x.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


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
    """(xq * xs) (w * ws)^T + bias; xs [M, 1], ws_row [1, N], both float32."""
    y = torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws_row, out_dtype=out_dtype)
    return y if bias is None else y + bias


def fp8_gemv(
    x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [1, K] (16-bit) against e4m3 w [N, K] with per-channel scales ws [N]."""
    n, k = w.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    block_n = 16
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
        BLOCK_K=512,
        num_warps=8,
        num_stages=3,
    )
    return y
