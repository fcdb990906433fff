"""Fused elementwise kernels for CUDA (Triton): what a decode step's profile says pays.

At batch 1 a Llama-8B decode step is ~4 matmuls per layer plus a tail of small kernels:
RMSNorm as pow / mean / rsqrt / mul / cast, the residual add, rotary as cat / neg / mul /
add for q and k, SiLU and the gate multiply; ~35 launches a layer, each a few microseconds
even inside a CUDA graph. Each function here does one of those chains in one launch:

    add_rms_norm(x, residual, weight, eps)   (norm(x + residual), x + residual)
    rms_norm(x, weight, eps)                 norm(x)
    silu_and_mul(x)                          silu(x[:, :d]) * x[:, d:]
    rotary_(q, k, cos, sin)                  rotate q and k in place (rotate-half layout)
    argmax_rows(x)                           x.argmax(-1) of a few long rows (greedy tokens)

They round where the PyTorch ops round (to the activation dtype after each op that
PyTorch runs in it), so bf16 results equal the unfused layers' up to fused multiply-adds.
The layers call them for CUDA tensors only; CPUs keep the plain PyTorch ops (the tests
run these kernels on the CPU through Triton's interpreter).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # grid dependency control: Hopper's programmatic dependent launch (PDL)
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # an older Triton: kernels launch as before
    gdc_wait = None


INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # as triton reads it


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.cache
def pdl(device: torch.device) -> bool:
    """Launch the decode step's Triton kernels with programmatic dependent launch: each one
    may be launched while the kernel before it drains, and waits (`gdc_wait`, its first
    instruction) until that kernel's writes are visible. It hides launch latency at each of
    a step's ~10 kernel boundaries a layer. Hopper or newer, a Triton that has it, and not
    CADENCE_PDL=0; kernels take `PDL: tl.constexpr` and pass it as `launch_pdl`."""
    return (
        gdc_wait is not None
        and os.environ.get("CADENCE_PDL", "1") != "0"
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    pre_w_ptr,
    out_ptr,
    res_out_ptr,
    n_rows,
    stride_x,
    stride_xh,  # between the heads of a token ([T, H, D] input; 0 for rows)
    heads,  # rows a token has (1 for [T, D])
    stride_res,
    stride_out,
    stride_res_out,
    n_cols,
    eps,
    pre_eps,
    HAS_RESIDUAL: tl.constexpr,
    PRE_NORM: tl.constexpr,  # x is normed by pre_w first (Gemma's post-block norm)
    GEMMA: tl.constexpr,  # weight stored as an offset from 1, product in float32 (Gemma)
    ROWS: tl.constexpr,  # rows a program norms (narrow rows, as per-head norms: several)
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    x_rows = x_ptr + (rows // heads) * stride_x + (rows % heads) * stride_xh
    x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    if PRE_NORM:
        pre_w = tl.load(pre_w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = _scaled_rows(x.to(tl.float32), pre_w, pre_eps, n_cols, dtype, GEMMA)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # PyTorch adds in the dtype
        tl.store(res_out_ptr + rows[:, None] * stride_res_out + cols[None, :], x, mask=mask)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    out = _scaled_rows(x.to(tl.float32), w, eps, n_cols, dtype, GEMMA)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=mask)


@triton.jit
def _scaled_rows(xf, w, eps, n_cols, dtype: tl.constexpr, GEMMA: tl.constexpr):
    """RMSNorm of float32 rows [ROWS, BLOCK] with weight w [BLOCK] (float32), rounded to
    dtype as the torch modules round."""
    var = tl.sum(xf * xf, axis=1) / n_cols
    x_hat = xf * tl.math.rsqrt(var + eps)[:, None]
    if GEMMA:  # (x_hat * (1 + w)).to(dtype): one rounding, as layers.norm.GemmaRMSNorm
        return (x_hat * (1.0 + w[None, :])).to(dtype)
    # w * x_hat.to(dtype), rounded twice as RMSNorm (and transformers' Llama) does
    return (w[None, :] * x_hat.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def scaled_head_halves(x1, x2, w1, w2, eps, head_dim, GEMMA: tl.constexpr):
    """_scaled_rows for heads held as their two halves x1, x2 [rows, D/2] (as the rotary
    kernels hold them), weights w1, w2 [D/2] float32: the RMSNorm of each whole head, each
    half rounded to x's dtype as the torch modules round. Returns the two halves."""
    dtype = x1.dtype
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    var = (tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / head_dim
    rstd = tl.math.rsqrt(var + eps)[:, None]
    a, b = a * rstd, b * rstd
    if GEMMA:
        return (a * (1.0 + w1[None, :])).to(dtype), (b * (1.0 + w2[None, :])).to(dtype)
    a = w1[None, :] * a.to(dtype).to(tl.float32)
    b = w2[None, :] * b.to(dtype).to(tl.float32)
    return a.to(dtype), b.to(dtype)


# Elements a program of narrow rows takes: per-head norms (128 wide) norm 16 heads a program,
# not one (a 8,192-token prefill's q norm was 262,144 programs of one head each).
_NORM_TILE = 2048


def _norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
    pre: tuple[torch.Tensor, float] | None = None,
):
    # [T, D] rows, or [T, H, D] heads (per-head q / k norms: no copy of a strided view)
    *lead, cols = x.shape
    assert len(lead) == 1 or (len(lead) == 2 and residual is None), "[T, D], or [T, H, D] alone"
    heads = lead[1] if len(lead) == 2 else 1
    rows = lead[0] * heads
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else out
    pre_weight, pre_eps = pre if pre is not None else (weight, 0.0)
    block = _pow2(cols)
    per_program = max(1, _NORM_TILE // block)
    if rows:
        _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
            x,
            residual if residual is not None else x,
            weight,
            pre_weight,
            out,
            res_out,
            rows,
            x.stride(0),
            x.stride(1) if heads > 1 else 0,
            heads,
            residual.stride(0) if residual is not None else 0,
            cols,  # (out is contiguous: a row, or a head, every `cols`)
            res_out.stride(0),
            cols,
            eps,
            pre_eps,
            HAS_RESIDUAL=residual is not None,
            PRE_NORM=pre is not None,
            GEMMA=gemma,
            ROWS=per_program,
            BLOCK=block,
            PDL=pdl(x.device),
            num_warps=8 if cols >= 2048 else 4,
            launch_pdl=pdl(x.device),
        )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False):
    """RMSNorm of each row of x [T, D], or of each head of x [T, H, D] (any strides but
    the last); `gemma`: GemmaRMSNorm's weight convention and rounding."""
    return _norm(x, None, weight, eps, gemma)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), as RMSNorm.forward(x, residual) returns."""
    return _norm(x, residual, weight, eps, gemma)


def norm_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    pre: tuple[torch.Tensor, float],
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(p + residual), p + residual) with p = pre_norm(x), `pre` its (weight, eps):
    a sandwich layer's post-block norm, residual add and next pre-block norm in one
    launch (both norms of one kind: `gemma` or not), rounded as the three ops would be."""
    return _norm(x, residual, weight, eps, gemma, pre)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x,
    stride_out,
    d,
    GELU_TANH: tl.constexpr,  # gelu(gate, approximate="tanh") instead of silu (GeGLU)
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    if GELU_TANH:
        # 0.5 g (1 + tanh(u)) = g * sigmoid(2u), u = sqrt(2 / pi) (g + 0.044715 g^3)
        u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = (g / (1.0 + tl.exp(-2.0 * u))).to(dtype)
    else:
        act = (g / (1.0 + tl.exp(-g))).to(dtype)
    tl.store(
        out_ptr + row * stride_out + cols,
        (act.to(tl.float32) * up.to(tl.float32)).to(dtype),
        mask=mask,
    )


def silu_and_mul(x: torch.Tensor, gelu_tanh: bool = False) -> torch.Tensor:
    """[gate | up] rows -> act(gate) * up; act is SiLU, or `gelu_tanh` (GeGLU)."""
    rows, two_d = x.shape
    d = two_d // 2
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows:
        block = min(1024, _pow2(d))
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
            x,
            out,
            x.stride(0),
            out.stride(0),
            d,
            GELU_TANH=gelu_tanh,
            BLOCK=block,
            PDL=pdl(x.device),
            num_warps=4,
            launch_pdl=pdl(x.device),
        )
    return out


@triton.jit
def rotate_half_rows(x1, x2, cos1, sin1, cos2, sin2):
    """x * cos + rotate_half(x) * sin for rows of one head, given as their halves x1, x2
    [rows, D/2] and the halves of cos / sin [D/2]; rotate_half(x) = [-x2, x1]. Each product
    and the sum are rounded to x's dtype, as PyTorch's ops do. Returns the two halves."""
    dtype = x1.dtype
    a1 = (x1.to(tl.float32) * cos1.to(tl.float32)[None, :]).to(dtype)
    b1 = (-x2.to(tl.float32) * sin1.to(tl.float32)[None, :]).to(dtype)
    a2 = (x2.to(tl.float32) * cos2.to(tl.float32)[None, :]).to(dtype)
    b2 = (x1.to(tl.float32) * sin2.to(tl.float32)[None, :]).to(dtype)
    return (
        (a1.to(tl.float32) + b1.to(tl.float32)).to(dtype),
        (a2.to(tl.float32) + b2.to(tl.float32)).to(dtype),
    )


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
            y1, y2 = rotate_half_rows(x1, x2, cos1, sin1, cos2, sin2)
            tl.store(ptr, y1, mask=hmask[:, None])
            tl.store(ptr + HALF, y2, mask=hmask[:, None])


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


# Greedy sampling's argmax over a [rows, vocab] logits tensor. torch's reduction gives each
# row to one block, which then walks 128k entries alone: ~35 us for a single row on an H200,
# most of a decode step's sampling. Here stage 1 splits every row into CHUNK-wide pieces
# (max and its first index each), stage 2 picks the best piece of each row.
_ARGMAX_CHUNK = 2048


@triton.jit
def _argmax_chunks_kernel(x_ptr, val_ptr, idx_ptr, stride_x, n_cols, n_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=float("-inf"))
    x = x.to(tl.float32)
    # NaN counts as the largest value, as in torch.argmax.
    x = tl.where(x != x, float("inf"), x)
    best, where = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(val_ptr + row * n_chunks + chunk, best)
    tl.store(idx_ptr + row * n_chunks + chunk, chunk * CHUNK + where)


@triton.jit
def _argmax_pick_kernel(val_ptr, idx_ptr, out_ptr, n_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    vals = tl.load(val_ptr + row * n_chunks + i, mask=i < n_chunks, other=float("-inf"))
    # Ties go to the earliest chunk, whose index is then the row's first maximum.
    _, best = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * n_chunks + best).to(tl.int64))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for a 2-D tensor: the first index of each row's maximum (NaN
    counts as the largest), int64 [rows]."""
    rows, cols = x.shape
    if rows == 0 or cols == 0 or x.stride(1) != 1:
        return x.argmax(dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    n_chunks = triton.cdiv(cols, _ARGMAX_CHUNK)
    vals = torch.empty((rows, n_chunks), dtype=torch.float32, device=x.device)
    idx = torch.empty((rows, n_chunks), dtype=torch.int32, device=x.device)
    _argmax_chunks_kernel[(rows, n_chunks)](
        x, vals, idx, x.stride(0), cols, n_chunks, CHUNK=_ARGMAX_CHUNK, num_warps=8
    )
    _argmax_pick_kernel[(rows,)](vals, idx, out, n_chunks, BLOCK=_pow2(n_chunks), num_warps=4)
    return out
