"""Split-KV decode (flash-decoding) for the Triton backend: kernel C and its reduce.

A decode step with few sequences runs few programs (one per sequence and KV head), each
over its whole context: 8 programs on a 132-SM GPU for one 8k-token sequence of Llama-8B.
Here each sequence's keys are cut into `num_parts` partitions, one program per
(decode, kv head, partition) writes a partial (normalised out, max, sum), and the reduce
(one program per decode and query head) rescales and combines them.

Nothing in the launch depends on the step's context lengths, so a CUDA graph can hold it:
the grid is (decodes, kv heads, num_parts), fixed by the batch size, and each program
derives its partition from its sequence's length, read from device memory:

    partition size = max(min_partition, cdiv(seq_len, num_parts) rounded up to BLOCK_N)

A short sequence uses fewer partitions (the programs past its end return at once), so
one captured graph serves every context length. `split_kv_parts` is the rule that says
when to split and into how many partitions; the backend's plan and the CUDA graphs both
ask it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.attention.triton_kernels import LOG2E, NO_WINDOW, attend
from cadence.ops.fused import gdc_wait

# Launch settings of kernel C and the split rule's constants, from benchmarks/split_kv_sweep.py
# on an H200 (Llama-3.1-8B's 32/8 heads, head_dim 128, bf16). Module constants, so a sweep
# can set them.
# 128-key tiles won at every batch size and context of the sweep (batch 1 at 8k: 14.5 us a
# layer against 15.7 with 64; batch 8 at 4k: 43 against 54); fp32 and wide heads get
# narrower ones (shared memory).
SPLIT_BLOCK_N = 128  # keys per inner step (and the partition size's granule)
SPLIT_NUM_WARPS = 4
SPLIT_NUM_STAGES = 2
MAX_SPLIT_PARTS = 64  # the reduce kernel's width: no plan splits a context further
SPLIT_PROGRAMS_PER_SM = 2  # aim: this many kernel-C programs per SM


def split_kv_parts(num_decodes: int, num_kv_heads: int, num_sms: int) -> int:
    """Partitions per context for a split-KV step of `num_decodes` decodes, or 0 when
    their `num_decodes * num_kv_heads` unsplit programs already cover the SMs. A power of
    two (so a graph size has one answer, and partitions align), bringing the launch to
    about SPLIT_PROGRAMS_PER_SM programs per SM."""
    programs = num_decodes * num_kv_heads
    if num_decodes < 1 or programs >= num_sms:
        return 0
    want = SPLIT_PROGRAMS_PER_SM * num_sms // programs
    if want < 2:
        return 0
    return min(MAX_SPLIT_PARTS, 1 << (want.bit_length() - 1))


def split_block_n(dtype: torch.dtype, head_dim: int) -> int:
    """Kernel C's key tile: SPLIT_BLOCK_N for 16-bit caches with heads up to 128 wide,
    narrower where its K and V tiles would not fit in shared memory."""
    elem = 4 if dtype == torch.float32 else 2
    return max(16, min(SPLIT_BLOCK_N, 128 * 128 * 2 // (elem * max(head_dim, 64))))


@triton.jit
def _partition_size(seq_len, num_parts, min_partition, BLOCK_N: tl.constexpr):
    size = tl.cdiv(tl.cdiv(seq_len, num_parts), BLOCK_N) * BLOCK_N
    return tl.maximum(size, min_partition)


@triton.jit
def _window_start(seq_len, window, BLOCK_N: tl.constexpr):
    """The first key tile a decode at position seq_len - 1 sees: partitions cut the keys
    from there (a sliding window's older keys are never read)."""
    return tl.maximum(seq_len - window, 0) // BLOCK_N * BLOCK_N


# The block table's row stride changes every step and num_parts with the batch size, and a
# window is any integer: none may compile a new specialisation.
@triton.jit(do_not_specialize=["stride_bt", "num_parts", "window"])
def split_kv_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    query_start_ptr,
    seq_lens_ptr,
    split_req_ptr,
    work_ptr,  # [S, Hq, num_parts, DIM + 2] fp32: normalised out, max, sum
    stride_qt,
    stride_qh,
    stride_ckv,
    stride_cblk,
    stride_ctok,
    stride_chead,
    stride_bt,
    group,
    num_heads,
    num_parts,
    min_partition,
    qk_scale,
    v_scale,
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
    kv_start = _window_start(seq_len, window, BLOCK_N)
    psize = _partition_size(seq_len - kv_start, num_parts, min_partition, BLOCK_N)
    kv_lo = kv_start + part * psize
    kv_hi = tl.minimum(seq_len, kv_lo + psize)
    # Partitions past this request's context write nothing; the reduce reads only the
    # cdiv(seq_len - kv_start, psize) partitions that exist.
    if kv_lo < kv_hi:
        g = tl.arange(0, BLOCK_M)  # one row per query head of the group
        row_ok = g < group
        head = (kvh * group + g).to(tl.int64)
        d = tl.arange(0, HEAD_DIM)
        io_ok = row_ok[:, None] & (d[None, :] < DIM)
        q = tl.load(
            q_ptr + tok * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=io_ok,
            other=0.0,
        )
        q_pos = tl.zeros([BLOCK_M], tl.int32) + (seq_len - 1)  # a decode sees everything
        acc, m_i, l_i = attend(
            q,
            q_pos - window,
            q_pos,
            cache_ptr,
            block_tables_ptr + req.to(tl.int64) * stride_bt,
            kvh.to(tl.int64) * stride_chead,
            stride_ckv,
            stride_cblk,
            stride_ctok,
            kv_lo,
            kv_lo,  # one masked loop: this kernel is bound by memory, not by the masks
            kv_lo,
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
            False,
        )
        # Every key of a partition is visible but the first tile's, whose keys before the
        # window may be all it has: l = 0 then, and the reduce weighs it 0 (not 0 / 0).
        entry = work_ptr + ((i * num_heads + head) * num_parts + part) * (DIM + 2)
        out = acc / tl.maximum(l_i, 1e-30)[:, None] * v_scale
        tl.store(entry[:, None] + d[None, :], out, mask=io_ok)
        tl.store(entry + DIM, m_i, mask=row_ok)
        tl.store(entry + DIM + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_parts", "window"])
def split_kv_reduce_kernel(
    work_ptr,
    out_ptr,
    query_start_ptr,
    seq_lens_ptr,
    split_req_ptr,
    stride_ot,
    stride_oh,
    num_heads,
    num_parts,
    min_partition,
    window,
    sinks_ptr,  # [Hq] float32: each head's sink logit (SINKS only)
    SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,  # kernel C's, for its partition size
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
    keys = seq_len - _window_start(seq_len, window, BLOCK_N)
    n_parts = tl.cdiv(keys, _partition_size(keys, num_parts, min_partition, BLOCK_N))
    p = tl.arange(0, MAX_PARTS)
    ok = p < n_parts
    entry = work_ptr + ((i * num_heads + h) * num_parts + p) * (DIM + 2)
    m = tl.load(entry + DIM, mask=ok, other=float("-inf"))
    l_p = tl.load(entry + DIM + 1, mask=ok, other=0.0)
    # Partition p's softmax sum relative to the global max; unused partitions weigh 0
    # (and their never-written outputs are masked to 0, so 0 * garbage cannot happen).
    m_max = tl.max(m, 0)
    if SINKS:  # the head's sink joins the sum once, here (the partitions never see it)
        sink = tl.load(sinks_ptr + h).to(tl.float32) * LOG2E
        m_max = tl.maximum(m_max, sink)
    w = tl.where(ok, tl.exp2(m - m_max) * l_p, 0.0)
    total = tl.sum(w, 0)
    if SINKS:
        total += tl.exp2(sink - m_max)
    d = tl.arange(0, HEAD_DIM)
    o = tl.load(entry[:, None] + d[None, :], mask=ok[:, None] & (d[None, :] < DIM), other=0.0)
    out = tl.sum(w[:, None] * o, 0) / total
    out_ptrs = out_ptr + tok * stride_ot + h * stride_oh + d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d < DIM)


def split_kv_attention(
    q: torch.Tensor,  # [T, Hq, D], rotated
    out: torch.Tensor,  # [T, Hq, D]: the split decodes' rows are written
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    split_req: torch.Tensor,  # [S] int32: the decode requests to attend here
    num_parts: int,
    min_partition: int,
    qk_scale: float,
    precision: str,
    dot_f32: bool,
    use_pdl: bool,
    v_scale: float = 1.0,
    window: int = NO_WINDOW,
    softcap: float | None = None,  # in the log2 domain, as kernel B takes it
    sinks: torch.Tensor | None = None,  # [Hq] float32 sink logits
) -> None:
    """Kernel C then its reduce, for the decodes in `split_req`."""
    n_split = split_req.numel()
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    if num_parts > MAX_SPLIT_PARTS:
        raise ValueError(f"num_parts {num_parts} exceeds MAX_SPLIT_PARTS {MAX_SPLIT_PARTS}")
    tile_dim = triton.next_power_of_2(head_dim)
    block_n = split_block_n(q.dtype, tile_dim)
    # One workspace for the partials: (out, max, sum) per partition. Under graph capture it
    # comes from the graph's pool, at a fixed address.
    work = torch.empty(
        (n_split, num_heads, num_parts, head_dim + 2), dtype=torch.float32, device=q.device
    )
    split_kv_kernel[(n_split, num_kv_heads, num_parts)](
        q,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        split_req,
        work,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        group,
        num_heads,
        num_parts,
        min_partition,
        qk_scale,
        v_scale,
        window,
        softcap or 1.0,
        SOFTCAP=softcap is not None,
        BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        HEAD_DIM=tile_dim,
        DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2],
        DOT_PRECISION=precision,
        DOT_F32=dot_f32,
        PDL=use_pdl,
        num_warps=SPLIT_NUM_WARPS,
        num_stages=SPLIT_NUM_STAGES,
        launch_pdl=use_pdl,
    )
    split_kv_reduce_kernel[(n_split, num_heads)](
        work,
        out,
        query_start_loc,
        seq_lens,
        split_req,
        out.stride(0),
        out.stride(1),
        num_heads,
        num_parts,
        min_partition,
        window,
        sinks if sinks is not None else work,
        SINKS=sinks is not None,
        HEAD_DIM=tile_dim,
        DIM=head_dim,
        BLOCK_N=block_n,
        MAX_PARTS=MAX_SPLIT_PARTS,
        PDL=use_pdl,
        num_warps=4,
        launch_pdl=use_pdl,
    )
