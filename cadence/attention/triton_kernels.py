"""Kernel B of the Triton paged-attention backend, `paged_attention_kernel`: attend every
work item of a mixed batch in one launch. Kernel A (the K/V write) is in
triton_write_kv.py, the split-KV pair (C) in triton_split_kv.py, the planning and launches
in triton_paged.py.

Both attention kernels (B and C) walk keys with `_attend_range`, the online-softmax inner
loop. Kernel B's prefill tile visits a range in phases: the tiles every query row sees in full (keys
before the program's first query token and inside its last token's window: no causal,
window or bounds masks, so no compares or selects in the loop that dominates a long
prefill), with masked loops before them (keys only the earlier rows' windows still hold;
none without a window) and after (the causal tail). Decode tiles (memory-bound) run the
masked loop alone, which keeps their compile time down.

Key limits (LIMITS): a step whose query tokens may see keys after their own positions (the
tokens of an image its model attends both ways, Gemma 3) hands each token's last visible
key; a row then sees keys up to its limit, the window still bounding it from below.

Layer options, all in the same kernels: a sliding window W (a runtime integer: a row at
position p sees keys p - W < j <= p; no window is a W past any context, so the compare
costs a decode loop nothing it would notice), soft-capped scores (SOFTCAP, Gemma 2:
c * tanh(s / c) before the mask), attention sinks (SINKS, GPT-OSS: a learned logit per
head joins each row's softmax denominator and attends to nothing; folded in once the keys
are done, by `add_sinks`) and head dims that are not powers of two (80, 96: the tiles are
DIM rounded up, the extra columns load as zeros and are never stored).
"""

from __future__ import annotations

import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait

NO_WINDOW = 1 << 30  # the window of a layer without one: past any context (and int32-safe)
LOG2E = tl.constexpr(1.4426950408889634)  # (a constexpr: jit code may read it)


@triton.jit
def add_sinks(acc, m_i, l_i, sinks_ptr, head, row_ok):
    """(acc, m, l) with each row's head's sink logit (natural log; the kernels keep m in
    the log2 domain) added to the softmax sum: the row's output is scaled by
    sum / (sum + e^sink) without any term of the sum overflowing."""
    sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * LOG2E
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp2(sink - m_new)


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
    q_lo,  # [BLOCK_M] int32: a row sees keys q_lo < j <= q_hi (its position minus the
    q_hi,  # window; its position, or its key limit)
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
            seen = (kv_pos[None, :] <= q_hi[:, None]) & (kv_pos[None, :] > q_lo[:, None])
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
    q_lo,
    q_hi,
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
            q, q_lo, q_hi, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv,
            stride_cblk, stride_ctok, kv_lo, kv_full_lo, qk_scale, softcap, True,
            SOFTCAP, BLOCK_M, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
        )  # fmt: skip
        acc, m_i, l_i = _attend_range(
            q, q_lo, q_hi, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv,
            stride_cblk, stride_ctok, kv_full_lo, kv_full_hi, qk_scale, softcap, False,
            SOFTCAP, BLOCK_M, BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
        )  # fmt: skip
        masked_lo = kv_full_hi
    acc, m_i, l_i = _attend_range(
        q, q_lo, q_hi, acc, m_i, l_i, cache_ptr, bt_row_ptr, kv_head_off, stride_ckv,
        stride_cblk, stride_ctok, masked_lo, kv_hi, qk_scale, softcap, True,
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
    sinks_ptr,  # [Hq] float32 (SINKS only)
    limits_ptr,  # [T] int32: each query token's last visible key (LIMITS only)
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    LIMITS: tl.constexpr,
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
    q_hi = q_pos
    kv_hi = tl.minimum(seq_len, pos0 + n_tok)  # the last token sees up to itself
    if LIMITS:  # tokens of an image attended both ways see on to its last token
        lim = tl.load(limits_ptr + t, mask=tok < n_tok, other=0)
        q_hi = tl.where(tok < n_tok, tl.maximum(lim, q_pos), q_pos)
        kv_hi = tl.minimum(seq_len, tl.max(tl.where(tok < n_tok, q_hi, 0), 0) + 1)
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
        q_pos - window,
        q_hi,
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
    if SINKS:
        acc, m_i, l_i = add_sinks(acc, m_i, l_i, sinks_ptr, head, row_ok)
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
    sinks_ptr,  # [Hq] float32: each head's sink logit (SINKS layers)
    limits_ptr,  # [T] int32: each query token's last visible key (LIMITS steps)
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    LIMITS: tl.constexpr,  # key limits (an image attended both ways: Gemma 3)
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
                    softcap, sinks_ptr, limits_ptr, SOFTCAP, SINKS, LIMITS, SMALL_M, G_PAD,
                    BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32, False,
                )  # fmt: skip
            else:
                _attend_rows_and_store(
                    q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                    group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                    stride_cblk, stride_ctok, stride_chead, qk_scale, v_scale, window,
                    softcap, sinks_ptr, limits_ptr, SOFTCAP, SINKS, LIMITS, BLOCK_M, G_PAD,
                    BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32, TWO_PHASE,
                )  # fmt: skip
        else:
            _attend_rows_and_store(
                q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                stride_cblk, stride_ctok, stride_chead, qk_scale, v_scale, window,
                softcap, sinks_ptr, limits_ptr, SOFTCAP, SINKS, LIMITS, BLOCK_M, G_PAD,
                BLOCK_N, HEAD_DIM, DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32, False,
            )  # fmt: skip
