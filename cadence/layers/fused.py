"""Fused elementwise kernels for CUDA (Triton): what a decode step's profile says pays.

At batch 1 a Llama-8B decode step is ~4 matmuls per layer plus a tail of small kernels:
RMSNorm as pow / mean / rsqrt / mul / cast, the residual add, rotary as cat / neg / mul /
add for q and k, SiLU and the gate multiply; ~35 launches a layer, each a few microseconds
even inside a CUDA graph. Each function here does one of those chains in one launch:

    add_rms_norm(x, residual, weight, eps)   (norm(x + residual), x + residual)
    rms_norm(x, weight, eps)                 norm(x)
    silu_and_mul(x)                          silu(x[:, :d]) * x[:, d:]
    rotary_(q, k, cos, sin)                  rotate q and k in place (rotate-half layout)

They round where the PyTorch ops round (to the activation dtype after each op that
PyTorch runs in it), so bf16 results equal the unfused layers' up to fused multiply-adds.
The layers call them for CUDA tensors only; CPUs keep the plain PyTorch ops (the tests
run these kernels on the CPU through Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # PyTorch adds in the dtype
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    y = (xf * tl.math.rsqrt(var + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(
        out_ptr + row * stride_out + cols,
        (w.to(tl.float32) * y.to(tl.float32)).to(dtype),
        mask=mask,
    )


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    rows, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    if rows:
        _rms_norm_kernel[(rows,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            res_out,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            res_out.stride(0),
            cols,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=_pow2(cols),
            num_warps=8 if cols >= 2048 else 4,
        )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _norm(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), as RMSNorm.forward(x, residual) returns."""
    return _norm(x, residual, weight, eps)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype)
    tl.store(
        out_ptr + row * stride_out + cols,
        (act.to(tl.float32) * up.to(tl.float32)).to(dtype),
        mask=mask,
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows, two_d = x.shape
    d = two_d // 2
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows:
        block = min(1024, _pow2(d))
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
            x, out, x.stride(0), out.stride(0), d, BLOCK=block, num_warps=4
        )
    return out


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ct,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """One program per token: every q and k head of it, in place."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    heads = tl.arange(0, BLOCK_H)
    cos1 = tl.load(cos_ptr + t * stride_ct + d)
    cos2 = tl.load(cos_ptr + t * stride_ct + HALF + d)
    sin1 = tl.load(sin_ptr + t * stride_ct + d)
    sin2 = tl.load(sin_ptr + t * stride_ct + HALF + d)
    dtype = cos1.dtype
    for which in tl.static_range(2):
        if which == 0:
            base = q_ptr + t * stride_qt
            stride_h = stride_qh
            n_heads = num_q_heads
        else:
            base = k_ptr + t * stride_kt
            stride_h = stride_kh
            n_heads = num_k_heads
        for h0 in range(0, n_heads, BLOCK_H):
            hmask = (h0 + heads) < n_heads
            ptr = base + (h0 + heads)[:, None] * stride_h + d[None, :]
            x1 = tl.load(ptr, mask=hmask[:, None], other=0.0)
            x2 = tl.load(ptr + HALF, mask=hmask[:, None], other=0.0)
            # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and
            # the sum rounded to the dtype, as PyTorch's ops do.
            a1 = (x1.to(tl.float32) * cos1.to(tl.float32)[None, :]).to(dtype)
            b1 = (-x2.to(tl.float32) * sin1.to(tl.float32)[None, :]).to(dtype)
            a2 = (x2.to(tl.float32) * cos2.to(tl.float32)[None, :]).to(dtype)
            b2 = (x1.to(tl.float32) * sin2.to(tl.float32)[None, :]).to(dtype)
            tl.store(ptr, (a1.to(tl.float32) + b1.to(tl.float32)).to(dtype), mask=hmask[:, None])
            tl.store(
                ptr + HALF, (a2.to(tl.float32) + b2.to(tl.float32)).to(dtype), mask=hmask[:, None]
            )


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place; cos / sin [T, D] (or [T, 1, D]) in
    the activation dtype. q and k may be strided views (of the fused qkv output)."""
    tokens, num_q, dim = q.shape
    cos = cos.reshape(tokens, dim)
    sin = sin.reshape(tokens, dim)
    if tokens:
        _rotary_kernel[(tokens,)](
            q,
            k,
            cos,
            sin,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            num_q,
            k.shape[1],
            HALF=dim // 2,
            BLOCK_H=min(8, _pow2(max(num_q, k.shape[1]))),
            num_warps=4,
        )
