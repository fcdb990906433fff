"""Kernel A of the Triton paged-attention backend (planned in triton_paged.py) and its
launch: rotate q in place and write the step's rotated K and V into their cache slots,
scaled and rounded to e4m3 for an FP8 cache. A model that norms each head of q and k
before rotary (Qwen3, Gemma 3) may hand over the norms' weights: then q is normed and
rotated in place and k normed on its way to the cache, in this one launch, rounded as the
RMSNorm modules round (two launches a layer fewer than the modules' own kernels)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.attention.base import is_fp8
from cadence.ops.fused import INTERPRETER as _INTERPRETER
from cadence.ops.fused import gdc_wait, pdl, rotate_half_rows, scaled_head_halves

# ---------------------------------------------------------------------------------------
# Kernel A: write the step's K/V into the cache.
# ---------------------------------------------------------------------------------------


@triton.jit
def _e4m3_grid(x, EXACT_ROUND: tl.constexpr):
    """x (float32, within +-448) for a cast to e4m3. GPUs convert with round-to-nearest-
    even; Triton's interpreter (3.9) rounds some values across a binade wrongly (-7.83 to
    -4) and flushes subnormals, so under it x is first rounded onto the e4m3 grid here
    (3 mantissa bits, subnormal steps of 2^-9), which the cast then keeps exactly."""
    if EXACT_ROUND:
        ax = tl.abs(x)
        e = tl.floor(tl.log2(tl.maximum(ax, 1e-30)))
        ulp = tl.exp2(tl.maximum(e, -6.0) - 3.0)
        y = ax / ulp
        r = tl.floor(y + 0.5)
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        r = tl.where(((r - y) == 0.5) & odd, r - 1.0, r)
        x = tl.where(x < 0, -r * ulp, r * ulp)
    return x


@triton.jit
def write_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    stride_chead,
    num_q_heads,
    num_kv_heads,
    k_inv_scale,  # FP8 caches: stored = clamp(k / k_scale) (1.0 otherwise, unused)
    v_inv_scale,
    q_norm_ptr,  # [D] the per-head norms' weights (NORM only)
    k_norm_ptr,
    norm_eps,
    BLOCK_SIZE: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2
    HALF_PAD: tl.constexpr,  # HALF rounded up to a power of two (a block's width)
    BLOCK_H: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    ROTARY: tl.constexpr,
    NORM: tl.constexpr,  # RMSNorm each head of q and k first (q in place)
    GEMMA_NORM: tl.constexpr,  # NORM's weights are offsets from 1 (Gemma's RMSNorm)
    SCALED: tl.constexpr,  # an FP8 cache: scale and saturate on the way in
    EXACT_ROUND: tl.constexpr,  # round onto the e4m3 grid before the cast (the interpreter)
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HALF_PAD)
    d = half[None, :]
    d_ok = d < HALF  # all true unless the head dim is not a power of two (80, 96)
    h = tl.arange(0, BLOCK_H)[:, None]
    if ROTARY:
        cos1 = tl.load(cos_ptr + t * stride_cos + half, mask=half < HALF)
        cos2 = tl.load(cos_ptr + t * stride_cos + HALF + half, mask=half < HALF)
        sin1 = tl.load(sin_ptr + t * stride_cos + half, mask=half < HALF)
        sin2 = tl.load(sin_ptr + t * stride_cos + HALF + half, mask=half < HALF)
    if NORM:  # each half's weights, float32
        qw1 = tl.load(q_norm_ptr + half, mask=half < HALF, other=0.0).to(tl.float32)
        qw2 = tl.load(q_norm_ptr + HALF + half, mask=half < HALF, other=0.0).to(tl.float32)
        kw1 = tl.load(k_norm_ptr + half, mask=half < HALF, other=0.0).to(tl.float32)
        kw2 = tl.load(k_norm_ptr + HALF + half, mask=half < HALF, other=0.0).to(tl.float32)
    if ROTARY or NORM:
        # q is changed in place (even for a padding token: harmless, its output is unused).
        hq = tl.arange(0, BLOCK_HQ)[:, None]
        for h0 in range(0, num_q_heads, BLOCK_HQ):
            qmask = ((h0 + hq) < num_q_heads) & d_ok
            ptr = q_ptr + t * stride_qt + (h0 + hq) * stride_qh + d
            q1 = tl.load(ptr, mask=qmask, other=0.0)
            q2 = tl.load(ptr + HALF, mask=qmask, other=0.0)
            if NORM:
                q1, q2 = scaled_head_halves(q1, q2, qw1, qw2, norm_eps, 2 * HALF, GEMMA_NORM)
            if ROTARY:
                q1, q2 = rotate_half_rows(q1, q2, cos1, sin1, cos2, sin2)
            tl.store(ptr, q1, mask=qmask)
            tl.store(ptr + HALF, q2, mask=qmask)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    # A negative slot marks a padding token (e.g. a CUDA-graph pad): write nothing.
    if slot >= 0:
        mask = (h < num_kv_heads) & d_ok
        dst = cache_ptr + (slot // BLOCK_SIZE) * stride_cblk + (slot % BLOCK_SIZE) * stride_ctok
        dst += h * stride_chead + d
        src_k = k_ptr + t * stride_kt + h * stride_kh + d
        src_v = v_ptr + t * stride_vt + h * stride_vh + d
        k1 = tl.load(src_k, mask=mask, other=0.0)
        k2 = tl.load(src_k + HALF, mask=mask, other=0.0)
        if NORM:
            k1, k2 = scaled_head_halves(k1, k2, kw1, kw2, norm_eps, 2 * HALF, GEMMA_NORM)
        if ROTARY:  # the rotated key goes to the cache only: attention reads keys there
            k1, k2 = rotate_half_rows(k1, k2, cos1, sin1, cos2, sin2)
        v1 = tl.load(src_v, mask=mask)
        v2 = tl.load(src_v + HALF, mask=mask)
        out_t = cache_ptr.dtype.element_ty
        if SCALED:  # e4m3 has no infinity: saturate at its largest finite value
            k1 = _e4m3_grid(tl.clamp(k1.to(tl.float32) * k_inv_scale, -448.0, 448.0), EXACT_ROUND)
            k2 = _e4m3_grid(tl.clamp(k2.to(tl.float32) * k_inv_scale, -448.0, 448.0), EXACT_ROUND)
            v1 = _e4m3_grid(tl.clamp(v1.to(tl.float32) * v_inv_scale, -448.0, 448.0), EXACT_ROUND)
            v2 = _e4m3_grid(tl.clamp(v2.to(tl.float32) * v_inv_scale, -448.0, 448.0), EXACT_ROUND)
        tl.store(dst, k1.to(out_t), mask=mask)
        tl.store(dst + HALF, k2.to(out_t), mask=mask)
        tl.store(dst + stride_ckv, v1.to(out_t), mask=mask)
        tl.store(dst + stride_ckv + HALF, v2.to(out_t), mask=mask)


# A per-head RMSNorm of q and k for kernel A: (q weight [D], k weight [D], eps, whether the
# weights are offsets from 1 as Gemma's RMSNorm stores them).
HeadNorm = tuple[torch.Tensor, torch.Tensor, float, bool]


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q: torch.Tensor | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv_scale: tuple[float, float] = (1.0, 1.0),
    head_norm: HeadNorm | None = None,
) -> None:
    """Launch kernel A (see TritonAttentionBackend.write_kv)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if (rotary is not None or head_norm is not None) and q is None:
        raise ValueError("rotary or a head norm needs q")
    cos = sin = k  # unused pointers without rotary
    if rotary is not None:
        cos, sin = (c.reshape(num_tokens, head_dim) for c in rotary)
    if q is None:
        q = k  # (unused)
    q_norm, k_norm, eps, gemma = head_norm or (k, k, 0.0, False)
    write_kv_kernel[(num_tokens,)](
        q,
        k,
        v,
        kv_cache,
        slot_mapping,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        q.shape[1],
        num_kv_heads,
        1.0 / kv_scale[0],
        1.0 / kv_scale[1],
        q_norm,
        k_norm,
        eps,
        BLOCK_SIZE=kv_cache.shape[2],
        HALF=head_dim // 2,
        HALF_PAD=triton.next_power_of_2(head_dim // 2),
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_HQ=min(8, triton.next_power_of_2(q.shape[1])),
        ROTARY=rotary is not None,
        NORM=head_norm is not None,
        GEMMA_NORM=gemma,
        SCALED=is_fp8(kv_cache.dtype),
        EXACT_ROUND=_INTERPRETER and is_fp8(kv_cache.dtype),
        PDL=pdl(k.device),
        launch_pdl=pdl(k.device),
    )
