"""A mixture of experts' routing on the GPU, with no host sync (so a decode step's forward
can be captured in a CUDA graph):

    topk_softmax(logits, k, renormalize)   router logits [T, E] -> (weights [T, k],
                                           expert ids [T, k] int32): softmax in float32,
                                           the k largest, optionally rescaled to sum to 1
    align(ids, experts, block_m, first)    the (token, slot) pairs sorted by expert, each
                                           expert's run padded to a multiple of block_m rows:

        sorted_pairs   [P_max]             pair index t * k + j at each padded row
                                           (T * k where the row is padding)
        block_expert   [P_max / block_m]   the (local) expert whose rows a block holds;
                                           -1 past the last run (its programs return at once)

P_max = T * k + min(E, T * k) * (block_m - 1) bounds every routing, so shapes depend on T
alone. A few pairs (decodes) align in one launch of one program; past PARALLEL_PAIRS (a
prefill) in three launches of many programs (count, label the runs, scatter). Under expert
parallelism a rank holds experts [first, first + E): pairs routed elsewhere get no row.
Within an expert's run the pairs' order follows atomic arrivals; a row's product does not
depend on its neighbours, so the results do not either.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops.fused import gdc_wait, pdl


@triton.jit
def softmax_top_k(
    x,
    num_experts,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    """(weights [R, K_PAD] float32, expert ids [R, K_PAD] int32) of float32 router logits
    x [R, E_PAD] (lanes past num_experts -inf, every row finite somewhere): the softmax's
    TOP_K largest, in order, rescaled to sum to 1 if RENORMALIZE; slots past TOP_K zero.
    Also the per-pair GEMVs' routing (moe_pairs.py), so both route alike."""
    experts = tl.arange(0, E_PAD)
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    # A row of NaN logits still picks real experts (whose weights are NaN, as torch's):
    # padding lanes rank below every probability, NaN lanes as zero.
    p_ranked = tl.where(p == p, p, 0.0)
    p_ranked = tl.where((experts < num_experts)[None, :], p_ranked, -2.0)
    slots = tl.arange(0, K_PAD)
    top_w = tl.zeros((x.shape[0], K_PAD), dtype=tl.float32)
    top_i = tl.zeros((x.shape[0], K_PAD), dtype=tl.int32)
    for j in tl.static_range(TOP_K):  # the j-th largest, then masked out
        which = tl.argmax(p_ranked, axis=1).to(tl.int32)
        picked = experts[None, :] == which[:, None]
        best = tl.sum(tl.where(picked, p, 0.0), axis=1)
        top_w = tl.where(slots[None, :] == j, best[:, None], top_w)
        top_i = tl.where(slots[None, :] == j, which[:, None], top_i)
        p_ranked = tl.where(picked, -1.0, p_ranked)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    return top_w, top_i


@triton.jit
def _topk_softmax_kernel(
    logits_ptr,  # [T, E]
    weights_ptr,  # [T, TOP_K] (float32 math, stored in the pointer's dtype)
    ids_ptr,  # [T, TOP_K] int32
    num_tokens,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, E_PAD)
    token_ok = tokens < num_tokens
    x = tl.load(
        logits_ptr + tokens[:, None].to(tl.int64) * stride_logits + experts[None, :],
        mask=token_ok[:, None] & (experts < num_experts)[None, :],
        other=-float("inf"),
    ).to(tl.float32)
    x = tl.where(token_ok[:, None], x, 0.0)  # (rows past T: finite, never stored)
    top_w, top_i = softmax_top_k(x, num_experts, TOP_K, K_PAD, E_PAD, RENORMALIZE)
    slots = tl.arange(0, K_PAD)
    out = tokens[:, None] * TOP_K + slots[None, :]
    ok = token_ok[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out, top_w.to(weights_ptr.dtype.element_ty), mask=ok)
    tl.store(ids_ptr + out, top_i, mask=ok)


def topk_softmax(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in out_dtype, computed in float32, expert ids [T, k] int32) from
    router logits [T, E]."""
    tokens, num_experts = logits.shape
    weights = torch.empty((tokens, top_k), dtype=out_dtype, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    if tokens:
        e_pad = triton.next_power_of_2(num_experts)
        block_t = max(1, min(16, 4096 // e_pad))
        _topk_softmax_kernel[(triton.cdiv(tokens, block_t),)](
            logits,
            weights,
            ids,
            tokens,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            K_PAD=triton.next_power_of_2(top_k),
            RENORMALIZE=renormalize,
            E_PAD=e_pad,
            BLOCK_T=block_t,
            PDL=pdl(logits.device),
            num_warps=4,
            launch_pdl=pdl(logits.device),
        )
    return weights, ids


@triton.jit
def _local_experts(ids_ptr, pairs, num_pairs, num_experts, first_expert):
    """(this rank's expert of each pair, whether the pair is real and routed here)."""
    local = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1) - first_expert
    return local, (pairs < num_pairs) & (local >= 0) & (local < num_experts)


@triton.jit
def _label_runs(
    cursor_ptr,
    block_expert_ptr,
    num_experts,
    max_rows,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCKS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Pairs per expert in `cursor` -> each run's first row in `cursor`; every row block
    labelled with the expert whose run holds it (-1 past the last run). One program: the
    parallel path's second launch, and a step of the one-program kernel."""
    if PDL:
        gdc_wait()
    experts = tl.arange(0, E_PAD)
    expert_ok = experts < num_experts
    counts = tl.load(cursor_ptr + experts, mask=expert_ok, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.debug_barrier()  # every thread has read the counts before they become cursors
    tl.store(cursor_ptr + experts, ends - padded, mask=expert_ok)
    ends = tl.where(expert_ok, ends, max_rows + BLOCK_M)  # (lanes past E never match)
    for b0 in range(0, max_rows // BLOCK_M, BLOCKS):  # a block's expert: runs ending before it
        blocks = b0 + tl.arange(0, BLOCKS)
        owner = tl.sum((ends[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        owner = tl.where(owner < num_experts, owner, -1)
        tl.store(block_expert_ptr + blocks, owner.to(tl.int64), mask=blocks < max_rows // BLOCK_M)


@triton.jit
def _fill_padding(sorted_pairs_ptr, lo, hi, num_pairs, CHUNK: tl.constexpr):
    """Rows [lo, hi) say padding (num_pairs) until a pair claims one."""
    for r0 in range(lo, hi, CHUNK):
        rows = r0 + tl.arange(0, CHUNK)
        padding = tl.full((CHUNK,), num_pairs, tl.int64)  # (num_pairs may be a constant 1)
        tl.store(sorted_pairs_ptr + rows, padding, mask=rows < hi)


@triton.jit
def _align_kernel(
    ids_ptr,  # [T * k] global expert ids
    sorted_pairs_ptr,  # [max_rows] int64
    block_expert_ptr,  # [max_rows / BLOCK_M] int64
    cursor_ptr,  # [E] int32 scratch: counts, then each run's next free row
    num_pairs,
    num_experts,  # this rank's
    first_expert,  # the global id of this rank's expert 0
    max_rows,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,  # pairs (and padded rows) a pass handles at once
    BLOCKS: tl.constexpr,  # row blocks a pass labels at once
    PDL: tl.constexpr,
):
    # One program (a few pairs: one launch is what costs): the passes hand their results on
    # through `cursor`, and a barrier makes one pass's global writes visible to every
    # thread of the next.
    if PDL:
        gdc_wait()
    experts = tl.arange(0, E_PAD)
    tl.store(cursor_ptr + experts, tl.zeros((E_PAD,), dtype=tl.int32), mask=experts < num_experts)
    tl.debug_barrier()
    for p0 in range(0, num_pairs, CHUNK):  # pairs per expert
        pairs = p0 + tl.arange(0, CHUNK)
        local, mine = _local_experts(ids_ptr, pairs, num_pairs, num_experts, first_expert)
        tl.atomic_add(cursor_ptr + local, 1, mask=mine)
    tl.debug_barrier()
    _label_runs(cursor_ptr, block_expert_ptr, num_experts, max_rows, BLOCK_M, E_PAD, BLOCKS, False)
    _fill_padding(sorted_pairs_ptr, 0, max_rows, num_pairs, CHUNK)
    tl.debug_barrier()
    for p0 in range(0, num_pairs, CHUNK):  # each pair takes the next row of its run
        pairs = p0 + tl.arange(0, CHUNK)
        local, mine = _local_experts(ids_ptr, pairs, num_pairs, num_experts, first_expert)
        row = tl.atomic_add(cursor_ptr + local, 1, mask=mine)
        tl.store(sorted_pairs_ptr + row, pairs.to(tl.int64), mask=mine)


# The same in three launches for many pairs (a prefill): counting and scattering in one
# program per CHUNK pairs instead of one program's passes over them all (whose atomics
# wait on each other: 105 us a layer at 16,384 pairs on the H200, 11 % of that step).


@triton.jit
def _count_kernel(
    ids_ptr,
    sorted_pairs_ptr,
    cursor_ptr,  # [E] int32, zeroed: pairs per expert
    num_pairs,
    num_experts,
    first_expert,
    max_rows,
    rows_per_program,  # of sorted_pairs, set to padding here
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    pairs = pid * CHUNK + tl.arange(0, CHUNK)
    local, mine = _local_experts(ids_ptr, pairs, num_pairs, num_experts, first_expert)
    tl.atomic_add(cursor_ptr + local, 1, mask=mine)
    lo = pid * rows_per_program
    _fill_padding(
        sorted_pairs_ptr, lo, tl.minimum(lo + rows_per_program, max_rows), num_pairs, CHUNK
    )


@triton.jit
def _scatter_kernel(
    ids_ptr,
    sorted_pairs_ptr,
    cursor_ptr,  # [E] int32: each run's next free row
    num_pairs,
    num_experts,
    first_expert,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    pairs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    local, mine = _local_experts(ids_ptr, pairs, num_pairs, num_experts, first_expert)
    row = tl.atomic_add(cursor_ptr + local, 1, mask=mine)
    tl.store(sorted_pairs_ptr + row, pairs.to(tl.int64), mask=mine)


# Above this many pairs a step aligns in three launches of many programs. Measured on the
# H200 in CUDA graphs (benchmarks/moe_group_sweep.py; RESULTS, issue 32, fifth part): the
# two paths tie at 1,024 pairs (Mixtral, 512 tokens: 8.2 / 8.3 us); at 2,048 the three
# launches win (Qwen3-30B-A3B, 256 tokens: 9.3 against 15.2 us; Mixtral, 1,024: 7.7 / 11.6).
PARALLEL_PAIRS = 1024
SCATTER_CHUNK = 256  # pairs a counting or scattering program takes


@triton.jit
def block_rows(
    block, sorted_pairs_ptr, num_pairs, top_k, GATED: tl.constexpr, BLOCK_M: tl.constexpr
):
    """Row block `block` of align()'s layout, as a grouped GEMM reads it: (its sorted rows,
    the pair each holds, which rows are real rather than padding, and the row of A each
    multiplies: the pair's token for a gated GEMM, else the sorted row itself)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + rows)
    a_rows = pairs // top_k if GATED else rows
    return rows, pairs, pairs < num_pairs, a_rows


def max_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows every routing of num_pairs pairs fits in once each run is padded: at most
    min(E, pairs) experts get a pair, each padded by under a block."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


def align(
    ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    first_expert: int = 0,
    parallel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs, block_expert) for expert ids [T, k]; experts [first_expert,
    first_expert + num_experts) are this rank's, numbered from 0 in block_expert.
    `parallel`: the three-launch path (None: above PARALLEL_PAIRS pairs)."""
    flat = ids.flatten().contiguous()
    num_pairs = flat.numel()
    rows = max_rows(num_pairs, num_experts, block_m)
    sorted_pairs = torch.empty(rows, dtype=torch.int64, device=flat.device)
    block_expert = torch.empty(rows // block_m, dtype=torch.int64, device=flat.device)
    if not num_pairs:
        return sorted_pairs, block_expert
    e_pad = triton.next_power_of_2(num_experts)
    use_pdl = pdl(flat.device)
    runs = dict(BLOCK_M=block_m, E_PAD=e_pad, BLOCKS=max(1, 8192 // e_pad), PDL=use_pdl)
    if not (num_pairs > PARALLEL_PAIRS if parallel is None else parallel):
        cursor = torch.empty(num_experts, dtype=torch.int32, device=flat.device)
        _align_kernel[(1,)](
            flat, sorted_pairs, block_expert, cursor, num_pairs, num_experts, first_expert,
            rows, CHUNK=1024, **runs, num_warps=8, launch_pdl=use_pdl,
        )  # fmt: skip
        return sorted_pairs, block_expert
    cursor = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    programs = triton.cdiv(num_pairs, SCATTER_CHUNK)
    common = dict(CHUNK=SCATTER_CHUNK, PDL=use_pdl, num_warps=4, launch_pdl=use_pdl)
    _count_kernel[(programs,)](
        flat, sorted_pairs, cursor, num_pairs, num_experts, first_expert, rows,
        triton.cdiv(rows, programs), **common,
    )  # fmt: skip
    _label_runs[(1,)](
        cursor, block_expert, num_experts, rows, **runs, num_warps=8, launch_pdl=use_pdl
    )
    _scatter_kernel[(programs,)](
        flat, sorted_pairs, cursor, num_pairs, num_experts, first_expert, **common
    )
    return sorted_pairs, block_expert
