"""The Triton kernels of the paged-attention backend that every step runs (A and B); the
split-KV pair (C) is in triton_split_kv.py, the planning and launches in triton_paged.py.

  A  write_kv_kernel        rotate q in place, write the step's rotated K and V to the cache
  B  paged_attention_kernel  attend every work item of a mixed batch, one launch

Both attention kernels walk keys with `_attend_range`, the online-softmax inner loop. Kernel
B's prefill tile visits a range in phases: the tiles every query row sees in full (keys
before the program's first query token and inside its last token's window: no causal,
window or bounds masks, so no compares or selects in the loop that dominates a long
prefill), with masked loops before them (keys only the earlier rows' windows still hold;
none without a window) and after (the causal tail). Decode tiles (memory-bound) run the
masked loop alone, which keeps their compile time down.

Layer options, all in the same kernels: a sliding window W (a runtime integer: a row at
position p sees keys p - W < j <= p; no window is a W past any context, so the compare
costs a decode loop nothing it would notice), soft-capped scores (SOFTCAP, Gemma 2:
c * tanh(s / c) before the mask) and head dims that are not powers of two (80, 96: the
tiles are DIM rounded up, the extra columns load as zeros and are never stored).
"""

from __future__ import annotations

import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait, rotate_half_rows

NO_WINDOW = 1 << 30  # the window of a layer without one: past any context (and int32-safe)

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
    BLOCK_SIZE: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2
    HALF_PAD: tl.constexpr,  # HALF rounded up to a power of two (a block's width)
    BLOCK_H: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    ROTARY: tl.constexpr,
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
        # q is rotated in place (even for a padding token: harmless, its output is unused).
        hq = tl.arange(0, BLOCK_HQ)[:, None]
        for h0 in range(0, num_q_heads, BLOCK_HQ):
            qmask = ((h0 + hq) < num_q_heads) & d_ok
            ptr = q_ptr + t * stride_qt + (h0 + hq) * stride_qh + d
            q1, q2 = rotate_half_rows(
                tl.load(ptr, mask=qmask, other=0.0),
                tl.load(ptr + HALF, mask=qmask, other=0.0),
                cos1,
                sin1,
                cos2,
                sin2,
            )
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
        k1 = tl.load(src_k, mask=mask)
        k2 = tl.load(src_k + HALF, mask=mask)
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


# ---------------------------------------------------------------------------------------
# Shared inner loop: online softmax over key positions of one request.
# ---------------------------------------------------------------------------------------


@triton.jit
def _softcap(s, cap):
    """cap * tanh(s / cap), elementwise, from exp2 (the interpreter has no libdevice tanh):
    tanh(|y|) = (1 - e) / (1 + e) with e = exp(-2 |y|) in (0, 1], so nothing overflows."""
    y = s / cap
    e = tl.exp2(-2.8853900817779268 * tl.abs(y))  # exp(-2|y|) = 2^(-2 log2(e) |y|)
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(y < 0, -t, t)


@triton.jit
def _attend_range(
    q,  # [BLOCK_M, HEAD_DIM], the model's dtype (an FP8 cache's tiles are widened to it)
    q_pos,  # [BLOCK_M] int32 absolute position of each row's token (causal limit)
    acc,  # [BLOCK_M, HEAD_DIM] fp32 running output (unnormalised)
    m_i,  # [BLOCK_M] fp32 running max (log2 domain)
    l_i,  # [BLOCK_M] fp32 running sum
    cache_ptr,
    bt_row_ptr,  # this request's block-table row
    kv_head_off,  # kv_head * stride_chead (int64)
    stride_ckv,
    stride_cblk,
    stride_ctok,
    kv_lo,
    kv_hi,
    qk_scale,  # softmax scale * log2(e): scores live in the log2 domain (exp2 is cheaper)
    window,  # a row at position p sees keys p - window < j <= p (no window: a huge one)
    softcap,  # log2-domain cap c * log2(e) where SOFTCAP
    MASKED: tl.constexpr,  # False: every key in [kv_lo, kv_hi) is visible to every row
    SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # the tile's width: DIM rounded up to a power of two
    DIM: tl.constexpr,  # the model's head dim; columns past it load as 0
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """Online softmax of the rows over key positions [kv_lo, kv_hi) of one request. With
    MASKED=False the caller promises whole tiles (kv_hi - kv_lo a multiple of BLOCK_N)
    that every row may see."""
    d = tl.arange(0, HEAD_DIM)
    d_ok = d < DIM  # padding columns read 0: they add nothing to q.k, and P V's are dropped
    for start in range(kv_lo, kv_hi, BLOCK_N):
        kv_pos = start + tl.arange(0, BLOCK_N)
        # Physical block of each key position. For BLOCK_N <= block size these are all the
        # same (or two) entries, served from L1; for tiny blocks it is a real gather.
        if MASKED:
            kv_ok = kv_pos < kv_hi
            blk = tl.load(bt_row_ptr + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0)
        else:
            blk = tl.load(bt_row_ptr + kv_pos // BLOCK_SIZE)
        blk = blk.to(tl.int64)
        off = blk * stride_cblk + (kv_pos % BLOCK_SIZE).to(tl.int64) * stride_ctok + kv_head_off
        # Masked loads give 0, so garbage in unused slots never reaches the dot products.
        if MASKED:
            k_ok = kv_ok[None, :] & d_ok[:, None]
            k = tl.load(cache_ptr + off[None, :] + d[:, None], mask=k_ok, other=0.0)
        elif DIM < HEAD_DIM:
            k = tl.load(cache_ptr + off[None, :] + d[:, None], mask=d_ok[:, None], other=0.0)
        else:
            k = tl.load(cache_ptr + off[None, :] + d[:, None])
        k = k.to(q.dtype)  # exact for e4m3; a no-op for a cache of the model's dtype
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k, input_precision=DOT_PRECISION)
        s = s * qk_scale  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:
            s = _softcap(s, softcap)
        if MASKED:
            seen = (kv_pos[None, :] <= q_pos[:, None]) & (kv_pos[None, :] > q_pos[:, None] - window)
            s = tl.where(kv_ok[None, :] & seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(
                cache_ptr + stride_ckv + off[:, None] + d[None, :],
                mask=kv_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
        elif DIM < HEAD_DIM:
            v = tl.load(
                cache_ptr + stride_ckv + off[:, None] + d[None, :], mask=d_ok[None, :], other=0.0
            )
        else:
            v = tl.load(cache_ptr + stride_ckv + off[:, None] + d[None, :])
        v = v.to(q.dtype)
        # P is rounded to the model's dtype, as tensor cores take it.
        p = p.to(v.dtype)
        if DOT_F32:
            pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def attend(
    q,
    q_pos,
    cache_ptr,
    bt_row_ptr,
    kv_head_off,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    kv_lo,
    kv_full_lo,  # keys in [kv_full_lo, kv_full_hi) are visible to every row: whole tiles,
    kv_full_hi,  # both bounds kv_lo plus a multiple of BLOCK_N
    kv_hi,
    qk_scale,
    window,
    softcap,
    SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    TWO_PHASE: tl.constexpr,  # False: one masked loop (less code to compile; for decodes)
):
    """(acc, m, l) of the rows over keys [kv_lo, kv_hi): the keys some rows' windows have
    left, the unmasked phase, then the tail. The unmasked phase pays where rows are many
    (prefill tiles: compute-bound); a decode's loop is bound by memory, so its kernels
    compile the masked loop alone."""
    # A finite start for the running max: a row whose keys are all masked in a tile keeps
    # m = -1e30, alpha = exp2(0) = 1 and p = exp2(-inf) = 0, never inf - inf = NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    masked_lo = kv_lo
    if TWO_PHASE:
        # Keys only the earlier rows' windows still hold (none without a window).
        acc, m_i, l_i = _attend_range(
            q, q_pos, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv,
            stride_cblk, stride_ctok, kv_lo, kv_full_lo, qk_scale, window, softcap, True,
            SOFTCAP, BLOCK_M, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
        )  # fmt: skip
        acc, m_i, l_i = _attend_range(
            q, q_pos, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv,
            stride_cblk, stride_ctok, kv_full_lo, kv_full_hi, qk_scale, window, softcap, False,
            SOFTCAP, BLOCK_M, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
        )  # fmt: skip
        masked_lo = kv_full_hi
    acc, m_i, l_i = _attend_range(
        q, q_pos, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv, stride_cblk,
        stride_ctok, masked_lo, kv_hi, qk_scale, window, softcap, True,
        SOFTCAP, BLOCK_M, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
    )  # fmt: skip
    return acc, m_i, l_i


# ---------------------------------------------------------------------------------------
# Kernel B: the whole mixed batch in one launch.
# ---------------------------------------------------------------------------------------


@triton.jit
def _attend_rows_and_store(
    q_ptr,
    out_ptr,
    cache_ptr,
    bt_row_ptr,
    kvh,
    tok0,  # first query token (global index) of this program
    n_tok,  # query tokens this program owns (>= 1)
    pos0,  # absolute position of token tok0
    seq_len,
    group,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    stride_chead,
    qk_scale,
    v_scale,
    window,
    softcap,
    SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    TWO_PHASE: tl.constexpr,
):
    # Row r of the tile is query token r // G_PAD, head r % G_PAD of the kv head's group.
    r = tl.arange(0, BLOCK_M)
    tok = r // G_PAD
    g = r % G_PAD
    row_ok = (tok < n_tok) & (g < group)
    head = (kvh * group + g).to(tl.int64)
    t = (tok0 + tok).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    io_ok = row_ok[:, None] & (d[None, :] < DIM)
    q = tl.load(
        q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=io_ok,
        other=0.0,
    )
    # Padding rows get positions past the chunk (what they see is never stored).
    q_pos = pos0 + tok
    kv_hi = tl.minimum(seq_len, pos0 + n_tok)  # the last token sees up to itself
    # The first row's window starts at pos0 - window + 1: tiles before it are skipped.
    kv_lo = tl.maximum(pos0 - window + 1, 0) // BLOCK_N * BLOCK_N
    # Keys every row sees: before the first row's position (causal) and within the last
    # row's window; whole tiles from kv_lo.
    kv_full_hi = tl.minimum(pos0, kv_hi) // BLOCK_N * BLOCK_N
    last_row_lo = pos0 + n_tok - window  # the last row's first visible key
    kv_full_lo = tl.maximum(tl.cdiv(tl.maximum(last_row_lo, 0), BLOCK_N) * BLOCK_N, kv_lo)
    kv_full_lo = tl.minimum(kv_full_lo, kv_full_hi)
    acc, m_i, l_i = attend(
        q,
        q_pos,
        cache_ptr,
        bt_row_ptr,
        kvh.to(tl.int64) * stride_chead,
        stride_ckv,
        stride_cblk,
        stride_ctok,
        kv_lo,
        kv_full_lo,
        kv_full_hi,
        kv_hi,
        qk_scale,
        window,
        softcap,
        SOFTCAP,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        DIM,
        BLOCK_SIZE,
        DOT_PRECISION,
        DOT_F32,
        TWO_PHASE,
    )
    # A real row sees at least its own key (l >= 1); a padding row may see none.
    out = acc / tl.maximum(l_i, 1e-30)[:, None] * v_scale
    tl.store(
        out_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=io_ok,
    )


# The block table's row stride changes every step (its width is the longest context in
# blocks) and the item size with the batch: neither may compile a new specialisation; nor
# may a layer's window (Phi-3's 2047 and "no window" would specialise apart).
@triton.jit(do_not_specialize=["stride_bt", "work_q", "window"])
def paged_attention_kernel(
    q_ptr,
    out_ptr,
    cache_ptr,
    block_tables_ptr,
    query_start_ptr,
    seq_lens_ptr,
    work_req_ptr,
    work_qoff_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    stride_chead,
    stride_bt,
    group,
    qk_scale,  # softmax scale * log2(e) * the cache's k_scale
    v_scale,  # the cache's v_scale (1.0 unless FP8)
    work_q,  # query tokens per work item (from build)
    window,  # the layer's sliding window (NO_WINDOW: none)
    softcap,  # the scores' cap in the log2 domain (SOFTCAP layers)
    SOFTCAP: tl.constexpr,
    TOK: tl.constexpr,  # query tokens per program (= BLOCK_M // G_PAD)
    BLOCK_M: tl.constexpr,
    SMALL_M: tl.constexpr,  # rows of the decode-sized tile
    G_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    TWO_PHASE: tl.constexpr,  # the big tile's unmasked first phase
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    item = tl.program_id(0)
    kvh = tl.program_id(1)
    sub = tl.program_id(2)
    req = tl.load(work_req_ptr + item)
    item_off = tl.load(work_qoff_ptr + item)
    q_start = tl.load(query_start_ptr + req).to(tl.int32)
    q_end = tl.load(query_start_ptr + req + 1).to(tl.int32)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    tok0 = q_start + item_off + sub * TOK
    tok_hi = tl.minimum(q_end, q_start + item_off + work_q)
    n_tok = tl.minimum(tok_hi - tok0, TOK)
    # Sub-tiles past the end of a short item (a decode in a batch planned for prefill
    # chunks) have nothing to do.
    if n_tok > 0:
        # The chunk is the last query_len tokens of the sequence (cached prefix before it).
        pos0 = seq_len - (q_end - q_start) + (tok0 - q_start)
        bt_row = block_tables_ptr + req.to(tl.int64) * stride_bt
        if SMALL_M < BLOCK_M:
            if n_tok * G_PAD <= SMALL_M:
                _attend_rows_and_store(
                    q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                    group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                    stride_cblk, stride_ctok, stride_chead, qk_scale, v_scale, window,
                    softcap, SOFTCAP, SMALL_M, G_PAD, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE,
                    DOT_PRECISION, DOT_F32, False,
                )  # fmt: skip
            else:
                _attend_rows_and_store(
                    q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                    group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                    stride_cblk, stride_ctok, stride_chead, qk_scale, v_scale, window,
                    softcap, SOFTCAP, BLOCK_M, G_PAD, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE,
                    DOT_PRECISION, DOT_F32, TWO_PHASE,
                )  # fmt: skip
        else:
            _attend_rows_and_store(
                q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                stride_cblk, stride_ctok, stride_chead, qk_scale, v_scale, window,
                softcap, SOFTCAP, BLOCK_M, G_PAD, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE,
                DOT_PRECISION, DOT_F32, False,
            )  # fmt: skip
