"""Paged attention in Triton: one backend for mixed batches of prefill chunks and decodes.

Per layer, `forward` launches up to four kernels:

  A  _write_kv_kernel         grid (T,)
     one program per new token: rotate its q heads in place (rotary, rotate-half layout)
     and copy its K (rotated) and V rows, all KV heads, into the token's cache slot. Runs
     first, so the attention below reads this step's keys from the cache like any other
     key (no special case for "new" keys).

  B  _paged_attention_kernel  grid (work items, Hkv, sub-tiles)
     A work item is up to work_q consecutive query tokens of one request, planned in
     build(). The program (item, kv head h, sub-tile s) owns TOK query tokens of the item
     and all G query heads that share kv head h, stacked as the tile's rows:

                 query rows (BLOCK_M = TOK * G_PAD)     context of the request
                 +--------------------------+      block table -> [b7][b2][b9][b4] ...
        tok 0    | head h*G+0 ... h*G+G-1   |              BLOCK_N keys per step
        tok 1    | head h*G+0 ... h*G+G-1   |      ------> S = Q K^T, causal mask,
         ...     |          ...             |              online softmax, acc += P V
        tok TOK-1| ...                      |
                 +--------------------------+

     so each K/V tile is loaded once for the whole GQA group and reused by every query
     token of the tile. Keys are visited in tiles of BLOCK_N positions; each position's
     physical block comes from the block table (a gather, so any block size works).
     Tiles: a decode-only step (every item one token) runs BLOCK_M = max(16, G_PAD) rows
     (G_PAD: group size rounded up to a power of two) with launch settings by batch size
     (decode_launch). Any other step runs 64-row tiles of 64 keys; programs that own few
     rows (decodes in a mixed batch) take the 16-row path instead: both are compiled into
     the same kernel and chosen per program at run time, so a mixed batch is still one
     launch without decodes paying for 64-row tiles. So the kernel has two compiled
     variants (plus one per decode setting). With the defaults all are built at start-up,
     by the memory profile and the CUDA-graph capture; with --enforce-eager (or graphs
     capped below DECODE_LARGE_BATCH, or num_gpu_blocks_override, which skips the memory
     profile) a variant compiles on its first use instead. An item of work_q
     tokens is covered by cdiv(work_q, TOK) sub-tile programs (grid axis 2), since
     build() plans items before it knows the group size.

  C  _split_kv_kernel + _split_kv_reduce_kernel   grid (split decodes, Hkv, partitions)
     Flash-decoding for few decodes with long contexts, which would otherwise run
     B * Hkv long programs on a 132-SM GPU. Each program attends one decode token's group
     to one partition of its context and writes partial (max, sum, normalised out); the
     reduce kernel (grid (split decodes, Hq)) rescales and combines the partials.
     build() decides which decodes go here (and those are left out of B's work list):
     all of a step's decodes, when they would give B fewer programs than the GPU has SMs
     (decodes x kv heads < SMs), the longest decode context is >= 1024 and the step's
     prefill tokens are too few to fill the GPU themselves. Partitions: enough for about
     two programs per SM, none shorter than 256 keys.

Accumulation is fp32 throughout; the output has q's dtype. Masked keys get score -inf and
their K/V loads are masked to zero, and the running max starts at a finite -1e30, so no
padded or uninitialised cache slot can turn into NaN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.layers.fused import gdc_wait, pdl, rotate_half_rows

LOG2E = 1.4426950408889634
MAX_WORK_Q = 64  # most query tokens in one work item of kernel B
DEFAULT_NUM_SMS = 132  # H100/H200; used when the device is not CUDA (interpreter, tests)
_INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # as triton reads it


# Tile shapes and launch settings, picked by a sweep on an H200 (32/8 heads, head_dim 128,
# bf16; MAX_BLOCK_M 64/128 x BLOCK_N 32/64/128 x 4/8 warps x 2/3 stages over prefill, mixed
# and decode batches): 64x64 tiles, 4 warps, 2 stages won or tied everywhere except lone
# long decodes, which the split-KV path serves. Module constants, so a sweep can set them.
MAX_BLOCK_M = 64  # rows (query tokens x group heads) of kernel B's prefill tile
BLOCK_N = 64  # keys per inner step of kernel B
SPLIT_BLOCK_N = 64  # keys per inner step of the split-KV kernel
SPLIT_NUM_WARPS = 4
SPLIT_NUM_STAGES = 2
# Kernel B when every work item is one decode token (decode steps, CUDA graphs), 16-bit
# caches: (BLOCK_N, num_warps, num_stages) by batch size, from benchmarks/kernel_sweep.py on
# an H200. Few decodes run few programs, each over its whole context: wide key tiles halve
# their serial steps (batch 1: 9.1 -> 6.9 us a layer at 141 keys, 14.7 -> 8.9 at 384).
# Many decodes fill the GPU: narrow tiles, 2 warps and a third stage hold ~4 TB/s.
DECODE_LARGE_BATCH = 32  # decodes from which the "large" settings apply
DECODE_SMALL = (128, 4, 2)
DECODE_LARGE = (64, 2, 3)


def decode_launch(num_decodes: int, head_dim: int) -> tuple[int, int, int]:
    block_n, warps, stages = DECODE_LARGE if num_decodes >= DECODE_LARGE_BATCH else DECODE_SMALL
    # Tuned at head_dim 128; wider heads would overflow shared memory with 128-key tiles.
    return min(block_n, 128 * 128 // max(head_dim, 128)), warps, stages


def _tile_config(block_m: int, dtype: torch.dtype, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of kernel B for its largest tile."""
    block_n = BLOCK_N
    if dtype == torch.float32 and head_dim > 64:
        block_n = min(block_n, 32)  # fp32 tiles are twice the registers and shared memory
    return block_n, (8 if block_m >= 128 else 4), 2


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Kernel A: write the step's K/V into the cache.
# ---------------------------------------------------------------------------------------


@triton.jit
def _write_kv_kernel(
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
    BLOCK_SIZE: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2
    BLOCK_H: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    ROTARY: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)[None, :]
    h = tl.arange(0, BLOCK_H)[:, None]
    if ROTARY:
        cos1 = tl.load(cos_ptr + t * stride_cos + tl.arange(0, HALF))
        cos2 = tl.load(cos_ptr + t * stride_cos + HALF + tl.arange(0, HALF))
        sin1 = tl.load(sin_ptr + t * stride_cos + tl.arange(0, HALF))
        sin2 = tl.load(sin_ptr + t * stride_cos + HALF + tl.arange(0, HALF))
        # q is rotated in place (even for a padding token: harmless, its output is unused).
        hq = tl.arange(0, BLOCK_HQ)[:, None]
        for h0 in range(0, num_q_heads, BLOCK_HQ):
            qmask = (h0 + hq) < num_q_heads
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
        mask = h < num_kv_heads
        dst = cache_ptr + (slot // BLOCK_SIZE) * stride_cblk + (slot % BLOCK_SIZE) * stride_ctok
        dst += h * stride_chead + d
        src_k = k_ptr + t * stride_kt + h * stride_kh + d
        src_v = v_ptr + t * stride_vt + h * stride_vh + d
        k1 = tl.load(src_k, mask=mask)
        k2 = tl.load(src_k + HALF, mask=mask)
        if ROTARY:  # the rotated key goes to the cache only: attention reads keys there
            k1, k2 = rotate_half_rows(k1, k2, cos1, sin1, cos2, sin2)
        out_t = cache_ptr.dtype.element_ty
        tl.store(dst, k1.to(out_t), mask=mask)
        tl.store(dst + HALF, k2.to(out_t), mask=mask)
        tl.store(dst + stride_ckv, tl.load(src_v, mask=mask).to(out_t), mask=mask)
        tl.store(dst + stride_ckv + HALF, tl.load(src_v + HALF, mask=mask).to(out_t), mask=mask)


# ---------------------------------------------------------------------------------------
# Shared inner loop: online softmax over key positions [kv_lo, kv_hi) of one request.
# ---------------------------------------------------------------------------------------


@triton.jit
def _attend(
    q,  # [BLOCK_M, HEAD_DIM], cache dtype
    q_pos,  # [BLOCK_M] int32 absolute position of each row's token (causal limit)
    cache_ptr,
    bt_row_ptr,  # this request's block-table row
    kv_head_off,  # kv_head * stride_chead (int64)
    stride_ckv,
    stride_cblk,
    stride_ctok,
    kv_lo,
    kv_hi,
    qk_scale,  # softmax scale * log2(e): scores live in the log2 domain (exp2 is cheaper)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    d = tl.arange(0, HEAD_DIM)
    # A finite start for the running max: a row whose keys are all masked in a tile keeps
    # m = -1e30, alpha = exp2(0) = 1 and p = exp2(-inf) = 0, never inf - inf = NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        kv_pos = start + tl.arange(0, BLOCK_N)
        kv_ok = kv_pos < kv_hi
        # Physical block of each key position. For BLOCK_N <= block size these are all the
        # same (or two) entries, served from L1; for tiny blocks it is a real gather.
        blk = tl.load(bt_row_ptr + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0).to(tl.int64)
        off = blk * stride_cblk + (kv_pos % BLOCK_SIZE).to(tl.int64) * stride_ctok + kv_head_off
        # Masked loads give 0, so garbage in unused slots never reaches the dot products.
        k = tl.load(cache_ptr + off[None, :] + d[:, None], mask=kv_ok[None, :], other=0.0)
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k, input_precision=DOT_PRECISION)
        s = s * qk_scale  # [BLOCK_M, BLOCK_N]
        keep = kv_ok[None, :] & (kv_pos[None, :] <= q_pos[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            cache_ptr + stride_ckv + off[:, None] + d[None, :], mask=kv_ok[:, None], other=0.0
        )
        # P is rounded to the cache dtype, as tensor cores take it.
        p = p.to(v.dtype)
        if DOT_F32:
            pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
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
    BLOCK_M: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # Row r of the tile is query token r // G_PAD, head r % G_PAD of the kv head's group.
    r = tl.arange(0, BLOCK_M)
    tok = r // G_PAD
    g = r % G_PAD
    row_ok = (tok < n_tok) & (g < group)
    head = (kvh * group + g).to(tl.int64)
    t = (tok0 + tok).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    # Padding rows get positions past the chunk; they still see key 0, so every row has at
    # least one unmasked key and l >= 1 below.
    q_pos = pos0 + tok
    kv_hi = tl.minimum(seq_len, pos0 + n_tok)  # the last token sees up to itself
    acc, m_i, l_i = _attend(
        q.to(cache_ptr.dtype.element_ty),
        q_pos,
        cache_ptr,
        bt_row_ptr,
        kvh.to(tl.int64) * stride_chead,
        stride_ckv,
        stride_cblk,
        stride_ctok,
        0,
        kv_hi,
        qk_scale,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        BLOCK_SIZE,
        DOT_PRECISION,
        DOT_F32,
    )
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


# The block table's row stride changes every step (its width is the longest context in
# blocks) and the item size with the batch: neither may compile a new specialisation.
@triton.jit(do_not_specialize=["stride_bt", "work_q"])
def _paged_attention_kernel(
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
    qk_scale,
    work_q,  # query tokens per work item (from build)
    TOK: tl.constexpr,  # query tokens per program (= BLOCK_M // G_PAD)
    BLOCK_M: tl.constexpr,
    SMALL_M: tl.constexpr,  # rows of the decode-sized tile
    G_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
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
                    stride_cblk, stride_ctok, stride_chead, qk_scale,
                    SMALL_M, G_PAD, BLOCK_N, HEAD_DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
                )  # fmt: skip
            else:
                _attend_rows_and_store(
                    q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                    group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                    stride_cblk, stride_ctok, stride_chead, qk_scale,
                    BLOCK_M, G_PAD, BLOCK_N, HEAD_DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
                )  # fmt: skip
        else:
            _attend_rows_and_store(
                q_ptr, out_ptr, cache_ptr, bt_row, kvh, tok0, n_tok, pos0, seq_len,
                group, stride_qt, stride_qh, stride_ot, stride_oh, stride_ckv,
                stride_cblk, stride_ctok, stride_chead, qk_scale,
                BLOCK_M, G_PAD, BLOCK_N, HEAD_DIM, BLOCK_SIZE, DOT_PRECISION, DOT_F32,
            )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Kernel C: split-KV decode (partials, then a reduce).
# ---------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["stride_bt"])
def _split_kv_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    query_start_ptr,
    seq_lens_ptr,
    split_req_ptr,
    work_ptr,  # [S, Hq, MAX_PARTS, HEAD_DIM + 2] fp32: normalised out, max, sum
    stride_qt,
    stride_qh,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    stride_chead,
    stride_bt,
    group,
    num_heads,
    partition_size,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MAX_PARTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    i = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    req = tl.load(split_req_ptr + i)
    tok = tl.load(query_start_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    kv_lo = part * partition_size
    kv_hi = tl.minimum(seq_len, kv_lo + partition_size)
    # Partitions past this request's context write nothing; the reduce reads only the
    # cdiv(seq_len, partition_size) partitions that exist.
    if kv_lo < kv_hi:
        g = tl.arange(0, BLOCK_M)  # one row per query head of the group
        row_ok = g < group
        head = (kvh * group + g).to(tl.int64)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr + tok * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        q_pos = tl.zeros([BLOCK_M], tl.int32) + (seq_len - 1)  # a decode sees everything
        acc, m_i, l_i = _attend(
            q.to(cache_ptr.dtype.element_ty),
            q_pos,
            cache_ptr,
            block_tables_ptr + req.to(tl.int64) * stride_bt,
            kvh.to(tl.int64) * stride_chead,
            stride_ckv,
            stride_cblk,
            stride_ctok,
            kv_lo,
            kv_hi,
            qk_scale,
            BLOCK_M,
            BLOCK_N,
            HEAD_DIM,
            BLOCK_SIZE,
            DOT_PRECISION,
            DOT_F32,
        )
        # The partition is non-empty and fully visible, so l >= 1 on every row.
        entry = work_ptr + ((i * num_heads + head) * MAX_PARTS + part) * (HEAD_DIM + 2)
        tl.store(entry[:, None] + d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
        tl.store(entry + HEAD_DIM, m_i, mask=row_ok)
        tl.store(entry + HEAD_DIM + 1, l_i, mask=row_ok)


@triton.jit
def _split_kv_reduce_kernel(
    work_ptr,
    out_ptr,
    query_start_ptr,
    seq_lens_ptr,
    split_req_ptr,
    stride_ot,
    stride_oh,
    num_heads,
    partition_size,
    HEAD_DIM: tl.constexpr,
    MAX_PARTS: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    i = tl.program_id(0)
    h = tl.program_id(1)
    req = tl.load(split_req_ptr + i)
    tok = tl.load(query_start_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req).to(tl.int32)
    n_parts = tl.cdiv(seq_len, partition_size)
    p = tl.arange(0, MAX_PARTS)
    ok = p < n_parts
    entry = work_ptr + ((i * num_heads + h) * MAX_PARTS + p) * (HEAD_DIM + 2)
    m = tl.load(entry + HEAD_DIM, mask=ok, other=float("-inf"))
    l_p = tl.load(entry + HEAD_DIM + 1, mask=ok, other=0.0)
    # Partition p's softmax sum relative to the global max; unused partitions weigh 0
    # (and their never-written outputs are masked to 0, so 0 * garbage cannot happen).
    w = tl.where(ok, tl.exp2(m - tl.max(m, 0)) * l_p, 0.0)
    d = tl.arange(0, HEAD_DIM)
    o = tl.load(entry[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(out_ptr + tok * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------
# The backend.
# ---------------------------------------------------------------------------------------


@dataclass
class TritonPlan:
    """What build() planned for a step; shared by every layer's forward."""

    work_req: torch.Tensor  # [N] int32 request of each kernel-B work item
    work_qoff: torch.Tensor  # [N] int32 first query token of the item, within its request
    work_q: int  # query tokens per work item (power of two)
    split_req: torch.Tensor  # [S] int32 decode requests that take the split-KV path
    partition_size: int  # keys per split-KV partition
    num_parts: int  # partitions of the longest split request
    max_parts: int  # num_parts rounded up to a power of two (the workspace's width)


class TritonAttentionBackend(AttentionBackend):
    """Paged attention in Triton kernels. See the module docstring for the kernels.

    `num_kv_heads` and `num_sms` only steer the split-KV heuristic in build(), which runs
    before any layer (so before the head count is seen): both have H200/Llama-8B-like
    defaults. `split_kv` forces the split path on (every decode) or off; None lets the
    heuristic choose. `split_min_partition` is the smallest partition it makes.
    """

    name = "triton"

    def __init__(
        self,
        num_kv_heads: int = 8,
        num_sms: int | None = None,
        split_kv: bool | None = None,
        split_min_partition: int = 256,
        split_min_context: int = 1024,
    ) -> None:
        self.num_kv_heads = num_kv_heads
        self.num_sms = num_sms
        self.split_kv = split_kv
        self.split_min_partition = split_min_partition
        self.split_min_context = split_min_context

    # ---- once a step ------------------------------------------------------------------

    def _sm_count(self, device: torch.device) -> int:
        if self.num_sms is None:
            if device.type == "cuda":
                props = torch.cuda.get_device_properties(device)
                self.num_sms = props.multi_processor_count
            else:
                return DEFAULT_NUM_SMS
        return self.num_sms

    def build(self, meta: AttentionMetadata) -> AttentionMetadata:
        if meta.block_size < 1:
            raise ValueError(f"block_size must be positive, got {meta.block_size}")
        device = meta.slot_mapping.device
        # Host planning on small int tensors, vectorised; one host-to-device copy at the end.
        qlens = torch.tensor(meta.query_lens_cpu, dtype=torch.int64)
        slens = torch.tensor(meta.seq_lens_cpu, dtype=torch.int64)
        num_reqs = qlens.numel()

        is_decode = qlens == 1
        split = torch.zeros(num_reqs, dtype=torch.bool)
        num_decodes = int(is_decode.sum())
        partition_size, num_parts = 0, 0
        if num_decodes and self.split_kv is not False:
            max_dec_len = int(slens[is_decode].max())
            num_programs = num_decodes * self.num_kv_heads  # without the split, one each
            sms = self._sm_count(device)
            use = self.split_kv or (
                num_programs < sms
                and max_dec_len >= self.split_min_context
                # a batch that also carries prefill work fills the GPU by itself
                and int(qlens[~is_decode].sum()) < sms
            )
            if use:
                split = is_decode
                # Enough partitions for ~2 programs per SM, none shorter than the minimum.
                want = _cdiv(2 * sms, num_programs)
                parts = max(1, min(want, _cdiv(max_dec_len, self.split_min_partition)))
                align = 64 if self.split_min_partition >= 64 else 16
                partition_size = _cdiv(_cdiv(max_dec_len, parts), align) * align
                num_parts = _cdiv(max_dec_len, partition_size)

        in_b = ~split & (qlens > 0)
        max_qlen = int(qlens[in_b].max()) if bool(in_b.any()) else 1
        work_q = min(MAX_WORK_Q, _next_pow2(max_qlen))
        items = torch.where(in_b, (qlens + work_q - 1) // work_q, 0)
        work_req = torch.repeat_interleave(torch.arange(num_reqs), items)
        first = torch.cumsum(items, 0) - items
        work_qoff = (torch.arange(work_req.numel()) - first[work_req]) * work_q
        split_req = torch.nonzero(split).flatten()

        n_items = work_req.numel()
        # One copy; each part starts 16-byte aligned (4 int32s), as the kernels were
        # compiled for (an unaligned pointer would compile another variant mid-serving).
        padded = -(-n_items // 4) * 4
        packed = torch.zeros(2 * padded + split_req.numel(), dtype=torch.int32)
        packed[:n_items] = work_req
        packed[padded : padded + n_items] = work_qoff
        packed[2 * padded :] = split_req
        if device.type == "cuda":  # pinned + non-blocking: do not wait for queued work
            packed = packed.pin_memory().to(device, non_blocking=True)
        else:
            packed = packed.to(device)
        meta.backend_data = TritonPlan(
            work_req=packed[:n_items],
            work_qoff=packed[padded : padded + n_items],
            work_q=work_q,
            split_req=packed[2 * padded :],
            partition_size=partition_size,
            num_parts=num_parts,
            max_parts=_next_pow2(num_parts) if num_parts else 0,
        )
        return meta

    def decode_plan(self, num_reqs: int, device: torch.device) -> TritonPlan:
        """A fixed plan for `num_reqs` single-token decodes (request i owns query token i),
        without the split-KV path: what a CUDA graph captures once and replays with new
        sequence lengths and block tables."""
        work_req = torch.arange(num_reqs, dtype=torch.int32, device=device)
        empty = torch.zeros(0, dtype=torch.int32, device=device)
        return TritonPlan(work_req, torch.zeros_like(work_req), 1, empty, 0, 0, 0)

    # ---- once a layer -----------------------------------------------------------------

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        q: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Kernel A: copy each token's K/V rows into its slot (a slot < 0 is skipped). With
        `rotary` (cos, sin [T, 1, D]), q is rotated in place and k on its way to the cache,
        in the same launch."""
        num_tokens, num_kv_heads, head_dim = k.shape
        if num_tokens == 0:
            return
        if rotary is not None:
            cos, sin = (c.reshape(num_tokens, head_dim) for c in rotary)
        else:
            q, cos, sin = k, k, k  # unused pointers
        _write_kv_kernel[(num_tokens,)](
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
            BLOCK_SIZE=kv_cache.shape[2],
            HALF=head_dim // 2,
            BLOCK_H=_next_pow2(num_kv_heads),
            BLOCK_HQ=min(8, _next_pow2(q.shape[1])),
            ROTARY=rotary is not None,
            PDL=pdl(k.device),
            launch_pdl=pdl(k.device),
        )

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        plan: TritonPlan = meta.backend_data
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        block_size = kv_cache.shape[2]
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads}")
        if kv_cache.stride(-1) != 1 or q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("q, k, v and the cache need a contiguous last (head_dim) axis")
        if v.stride(-1) != 1:
            raise ValueError("q, k, v and the cache need a contiguous last (head_dim) axis")
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        if num_tokens == 0:
            return out
        cache_strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2))

        self.write_kv(k, v, kv_cache, meta.slot_mapping, q, rotary)
        use_pdl = pdl(q.device)

        group = num_heads // num_kv_heads
        g_pad = _next_pow2(group)
        qk_scale = scale * LOG2E
        # fp32 caches get true fp32 products (tf32 would break the reference tolerance).
        precision = "ieee" if kv_cache.dtype == torch.float32 else "tf32"
        # Triton's interpreter multiplies bf16 blocks as raw 16-bit integers (seen with
        # triton 3.9), so under it the products run in fp32 on the same bf16 values.
        dot_f32 = _INTERPRETER and kv_cache.dtype == torch.bfloat16
        block_tables = meta.block_tables
        n_items = plan.work_req.numel()
        if n_items:
            # Two tile shapes, so two compiled variants in all: decode-only steps take the
            # small tile alone; any other step the 64-row tile, with the small one chosen
            # at run time by programs that own few rows (decodes in a mixed batch).
            small_m = max(16, g_pad)
            block_m = small_m if plan.work_q == 1 else max(small_m, MAX_BLOCK_M)
            tok = block_m // g_pad
            n_sub = _cdiv(plan.work_q, tok)
            block_n, num_warps, num_stages = _tile_config(block_m, kv_cache.dtype, head_dim)
            if plan.work_q == 1 and kv_cache.dtype != torch.float32:
                block_n, num_warps, num_stages = decode_launch(n_items, head_dim)
            _paged_attention_kernel[(n_items, num_kv_heads, n_sub)](
                q,
                out,
                kv_cache,
                block_tables,
                meta.query_start_loc,
                meta.seq_lens,
                plan.work_req,
                plan.work_qoff,
                q.stride(0),
                q.stride(1),
                out.stride(0),
                out.stride(1),
                *cache_strides,
                kv_cache.stride(3),
                block_tables.stride(0),
                group,
                qk_scale,
                plan.work_q,
                TOK=tok,
                BLOCK_M=block_m,
                SMALL_M=small_m,
                G_PAD=g_pad,
                BLOCK_N=block_n,
                HEAD_DIM=head_dim,
                BLOCK_SIZE=block_size,
                DOT_PRECISION=precision,
                DOT_F32=dot_f32,
                PDL=use_pdl,
                num_warps=num_warps,
                num_stages=num_stages,
                launch_pdl=use_pdl,
            )

        n_split = plan.split_req.numel()
        if n_split:
            # One workspace allocation for the partials: (out, max, sum) per partition.
            shape = (n_split, num_heads, plan.max_parts)
            work = torch.empty((*shape, head_dim + 2), dtype=torch.float32, device=q.device)
            _split_kv_kernel[(n_split, num_kv_heads, plan.num_parts)](
                q,
                kv_cache,
                block_tables,
                meta.query_start_loc,
                meta.seq_lens,
                plan.split_req,
                work,
                q.stride(0),
                q.stride(1),
                *cache_strides,
                kv_cache.stride(3),
                block_tables.stride(0),
                group,
                num_heads,
                plan.partition_size,
                qk_scale,
                BLOCK_M=max(16, g_pad),
                BLOCK_N=SPLIT_BLOCK_N,
                HEAD_DIM=head_dim,
                BLOCK_SIZE=block_size,
                MAX_PARTS=plan.max_parts,
                DOT_PRECISION=precision,
                DOT_F32=dot_f32,
                PDL=use_pdl,
                num_warps=SPLIT_NUM_WARPS,
                num_stages=SPLIT_NUM_STAGES,
                launch_pdl=use_pdl,
            )
            _split_kv_reduce_kernel[(n_split, num_heads)](
                work,
                out,
                meta.query_start_loc,
                meta.seq_lens,
                plan.split_req,
                out.stride(0),
                out.stride(1),
                num_heads,
                plan.partition_size,
                HEAD_DIM=head_dim,
                MAX_PARTS=plan.max_parts,
                PDL=use_pdl,
                num_warps=4,
                launch_pdl=use_pdl,
            )
        return out
