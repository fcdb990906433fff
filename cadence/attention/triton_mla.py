"""Multi-head latent attention in Triton (DeepSeek-V2/V3; models/mla.py): every query head
attends to one shared key per token, the cached latent (c_kv [LATENT], k_rope [ROPE]),
whose first LATENT dims are also the value. Launched by TritonAttentionBackend.
forward_latent over the same plan (work items) as kernel B, so it runs inside the same
CUDA graphs.

  mla_attention_kernel   grid (work items, head blocks, sub-tiles x splits)
     A program owns TOK query tokens of its item and BLOCK_H heads, stacked as rows
     (BLOCK_M = TOK x BLOCK_H: every head of a token shares its keys). Per key tile it
     loads the latent and the rope part apart (512 + 64: no 1,024-wide padded tile) and
     scores q_lat . c_kv + q_rope . k_rope, online softmax, acc += p c_kv. The output is
     [T, H, LATENT]: the model lifts it to each head's value (W_UV) itself.
     With `splits` > 1 (decode-only steps whose programs would not cover the SMs: one
     shared key head leaves few programs) each program takes 1/splits of its keys and
     writes its unnormalised partial; `mla_reduce_kernel` (grid (tokens, heads)) merges
     them. The split count is a runtime value: every batch size shares one variant.

Masked scores are -inf and the running max starts at a finite -1e30, so a row (or a
split) that sees no key adds nothing and never turns into NaN. Accumulation is fp32; an
FP8 cache's tiles are widened to q's dtype (its scale is 1: one latent, no K/V scales).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops.fused import INTERPRETER as _INTERPRETER

LOG2E = 1.4426950408889634
MAX_SPLITS = 16
# Launch settings (rows, keys per step, warps, stages) from benchmarks/mla_kernel_sweep.py
# on an H200 (16 heads, 512 + 64, bf16; module constants so that the sweep can set them).
# Decode-only steps run 16 rows (tl.dot's smallest): few decodes narrow key tiles (batch
# 1 at 384 keys: 8.6 us, against 10.2 with 128), many wide ones (batch 64 at 1,280: 44 us,
# against 73 with 32). Prefill: 2 x 1,024 new tokens in 0.23 ms against 0.50 with
# (32, 32, 8, 2). fp32 tiles take half the keys a step and at most two stages.
DECODE_SMALL = (16, 32, 4, 2)
DECODE_LARGE = (16, 128, 4, 2)
DECODE_LARGE_ITEMS = 32  # decodes from which DECODE_LARGE applies
PREFILL_TILE = (64, 64, 8, 3)


# Integers that vary from step to step are not specialised on (a value of 1 or a multiple of
# 16 would otherwise compile another variant mid-serving); the split count is one of them:
# a variant is a tile kind and whether its keys are split (SPLIT), nothing else.
@triton.jit(do_not_specialize=["stride_bt", "num_tokens", "work_q", "splits"])
def mla_attention_kernel(
    q_ptr,  # [T, H, LATENT + ROPE]
    out_ptr,  # [T, H, LATENT]
    part_ptr,  # [splits, T, H, LATENT + 2] fp32: acc, then m and l (SPLIT only)
    cache_ptr,  # [num_blocks, block_size, 1, LATENT + ROPE]
    block_tables_ptr,
    qsl_ptr,
    seq_lens_ptr,
    work_req_ptr,
    work_qoff_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cblk,
    stride_ctok,
    stride_bt,
    num_tokens,
    num_heads,
    qk_scale,  # scale * log2(e): scores are kept in the log2 domain
    work_q,
    splits,  # programs sharing each (item, head block)'s keys (1 unless SPLIT)
    TOK: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,  # partials to `part_ptr` for mla_reduce_kernel, not the output
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,  # products in fp32 (Triton's interpreter and bf16: see paged)
):
    item = tl.program_id(0)
    head_block = tl.program_id(1)
    sub = tl.program_id(2) // splits
    split = tl.program_id(2) % splits
    BLOCK_M: tl.constexpr = TOK * BLOCK_H

    req = tl.load(work_req_ptr + item)
    item_first = tl.load(work_qoff_ptr + item)
    first = item_first + sub * TOK
    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    context = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    t = first + rows // BLOCK_H  # query token within the request
    head = head_block * BLOCK_H + rows % BLOCK_H
    row_ok = (t < q_len) & (t < item_first + work_q) & (head < num_heads)
    q_pos = context + t
    token = (q_start + t).to(tl.int64)
    c = tl.arange(0, LATENT)
    r = tl.arange(0, ROPE)
    q_row = q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh
    q_lat = tl.load(q_row + c[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row + LATENT + r[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_F32:
        q_lat, q_rope = q_lat.to(tl.float32), q_rope.to(tl.float32)

    # Keys the program's rows can see: up to its last real token's position.
    last_t = tl.minimum(tl.minimum(first + TOK, q_len), item_first + work_q)
    hi = tl.minimum(context + last_t, seq_len)
    per = tl.cdiv(tl.cdiv(tl.maximum(hi, 0), splits), BLOCK_N) * BLOCK_N
    lo = split * per
    hi = tl.minimum(hi, lo + per)

    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, LATENT], tl.float32)
    bt_row = block_tables_ptr + req.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        key_ok = pos < hi
        blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        off = blk * stride_cblk + (pos % BLOCK_SIZE).to(tl.int64) * stride_ctok
        kc = tl.load(cache_ptr + off[:, None] + c[None, :], mask=key_ok[:, None], other=0.0)
        kr = tl.load(
            cache_ptr + off[:, None] + LATENT + r[None, :], mask=key_ok[:, None], other=0.0
        )
        kc, kr = kc.to(q_lat.dtype), kr.to(q_lat.dtype)
        s = tl.dot(q_lat, tl.trans(kc), input_precision=DOT_PRECISION)
        s += tl.dot(q_rope, tl.trans(kr), input_precision=DOT_PRECISION)
        s = s * qk_scale
        visible = key_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc, input_precision=DOT_PRECISION)
        m_i = m_new

    if not SPLIT:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptr = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + c[None, :]
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        width = LATENT + 2
        at = ((split * num_tokens + token) * num_heads + head).to(tl.int64) * width
        tl.store(part_ptr + at[:, None] + c[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ptr + at + LATENT, m_i, mask=row_ok)
        tl.store(part_ptr + at + LATENT + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["num_tokens", "splits"])
def mla_reduce_kernel(
    part_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    num_tokens,
    num_heads,
    splits,
    LATENT: tl.constexpr,
    MAX_S: tl.constexpr,  # MAX_SPLITS: the split axis's tile (the first `splits` are real)
):
    """out[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the splits."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, MAX_S)
    real = s < splits
    c = tl.arange(0, LATENT)
    width = LATENT + 2
    at = ((s * num_tokens + token) * num_heads + head).to(tl.int64) * width
    m = tl.load(part_ptr + at + LATENT, mask=real, other=-1e30)
    l_s = tl.load(part_ptr + at + LATENT + 1, mask=real, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.exp2(m - m_max)
    acc = tl.load(part_ptr + at[:, None] + c[None, :], mask=real[:, None], other=0.0)
    total = tl.sum(acc * w[:, None], 0)
    denom = tl.sum(l_s * w, 0)
    o = total / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + c, o.to(out_ptr.dtype.element_ty))


def decode_splits(num_programs: int, num_sms: int) -> int:
    """Key splits for a decode-only step of `num_programs` (item, head block) programs:
    enough to cover the SMs, a power of two, at most MAX_SPLITS."""
    splits = 1
    while splits < MAX_SPLITS and num_programs * splits * 2 <= num_sms:
        splits *= 2
    return splits


def mla_attention(
    q: torch.Tensor,  # [T, H, LATENT + ROPE]
    cache: torch.Tensor,  # [num_blocks, block_size, 1, LATENT + ROPE]
    latent_dim: int,
    meta,  # AttentionMetadata built by the Triton backend (kernel B's work items)
    scale: float,
    num_sms: int,
) -> torch.Tensor:
    """The attention-weighted latent [T, H, latent_dim] of every query token of the plan's
    work items (see the module docstring)."""
    plan = meta.backend_data
    work_req, work_qoff, work_q = plan.work_req, plan.work_qoff, plan.work_q
    if plan.split_req.numel():  # (a latent model's backend is built without split-KV)
        raise ValueError("kernel B's split-KV decodes are not for latent attention")
    block_tables = meta.block_tables
    num_tokens, num_heads, width = q.shape
    rope_dim = width - latent_dim
    out = torch.empty((num_tokens, num_heads, latent_dim), dtype=q.dtype, device=q.device)
    n_items = work_req.numel()
    if not n_items:
        return out
    block_h = min(16, triton.next_power_of_2(num_heads))
    decode = work_q == 1
    tile = PREFILL_TILE
    if decode:
        tile = DECODE_LARGE if n_items >= DECODE_LARGE_ITEMS else DECODE_SMALL
    rows, block_n, num_warps, num_stages = tile
    block_m = max(block_h, rows)
    tok = block_m // block_h
    n_sub = triton.cdiv(work_q, tok)
    head_blocks = triton.cdiv(num_heads, block_h)
    splits = decode_splits(n_items * head_blocks, num_sms) if decode else 1
    wide = q.dtype == torch.float32
    if wide:
        block_n, num_stages = max(16, block_n // 2), min(num_stages, 2)
    part = q  # (an unused pointer when nothing splits)
    if splits > 1:
        part = torch.empty(
            (splits, num_tokens, num_heads, latent_dim + 2), dtype=torch.float32, device=q.device
        )
    mla_attention_kernel[(n_items, head_blocks, n_sub * splits)](
        q,
        out,
        part,
        cache,
        block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        work_req,
        work_qoff,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        cache.stride(0),
        cache.stride(1),
        block_tables.stride(0),
        num_tokens,
        num_heads,
        scale * LOG2E,
        work_q,
        splits,
        TOK=tok,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        LATENT=latent_dim,
        ROPE=rope_dim,
        BLOCK_SIZE=cache.shape[1],
        SPLIT=splits > 1,
        DOT_PRECISION="ieee" if wide else "tf32",
        # Triton's interpreter multiplies bf16 blocks as raw integers (see triton_paged)
        DOT_F32=_INTERPRETER and q.dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if splits > 1:
        mla_reduce_kernel[(num_tokens, num_heads)](
            part,
            out,
            out.stride(0),
            out.stride(1),
            num_tokens,
            num_heads,
            splits,
            LATENT=latent_dim,
            MAX_S=MAX_SPLITS,
        )
    return out
