"""A large step's expert MLPs through torch's grouped GEMM (`torch._grouped_mm`: CUTLASS's
grouped GEMM on Hopper, TMA loads and warp-specialised pipelines), where the tile table
says it beats the Triton grouped GEMMs (cadence/ops/fused_moe.py) for a step of that size
(an entry's "grouped_mm": true, from benchmarks/moe_grouped_mm_sweep.py).

The (token, slot) pairs are sorted by expert with no padding, since each expert's rows
are one group of the GEMM whatever their count:

    rows      [P]       the token of each sorted row (an expert's rows contiguous)
    offsets   [E]       int32: where each expert's rows end (the GEMM's group ends)
    row_of    [T * k]   the sorted row of each pair; -1 for a pair routed to another
                        rank's expert (expert parallelism: those pairs have no row)

then   h = x[rows] @ w13[e]^T   (one group per expert: gate and up side by side)
       act = silu(gate) * up    (fused.silu_and_mul)
       o = act @ w2[e]^T
       out[t] = sum_j weights[t, j] * o[row_of[t * k + j]]   (float32 sum, one launch)

FP8 experts (e4m3 weights, a float32 scale per expert and output row) take the same steps
through `torch._scaled_grouped_mm` (CUTLASS's FP8 grouped GEMM on Hopper), W8A8: the token
rows are quantized per token before the gather (cadence/ops/fp8_rows.py), and the
activation is quantized per row as it is computed (`silu_mul_quantize`, so the 16-bit
activation never reaches memory); each GEMM scales its accumulator by the row's and the
column's scales and rounds to bf16. The table flags, on the H200, every step of more than
128 tokens on Mixtral-8x7B (so its batch-256 decode steps too) and of more than 256 on
Qwen3-30B-A3B; the smaller steps take the Triton GEMMs (fused_moe.py: W8A8 too where the
entry has "w8a8" tiles, else W8A16).

Nothing waits on the host (the group ends stay on the device), so a step can be captured
in a CUDA graph. Weights without biases or a clamped gate only (`usable`): GPT-OSS's keep
the Triton GEMMs. Rounding: each GEMM's output is rounded to the activations' dtype before
the routing weight scales it (the Triton path scales the float32 accumulator first), so
the two agree to rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops import fp8_rows, fused, moe_routing
from cadence.ops.fused import gdc_wait, pdl
from cadence.ops.moe_epilogue import sum_slots_kernel

# GPUs (compute capability) torch's scaled grouped GEMM runs on: Hopper, datacenter Blackwell.
_SCALED_GPUS = ((9, 0), (10, 0))

# Bytes of gate-up output [pairs, 2I] a chunk of a step's tokens holds at once. Mixtral-8x7B
# at 8,192 tokens would hold 0.94 GB (and its activation 0.47 GB beside it), where the Triton
# GEMMs hold the activation alone; the memory profile sizes the KV pool after the peak, so
# such steps run in two chunks of 4,096 tokens. Qwen3-30B-A3B's (0.2 GB) runs whole.
CHUNK_BYTES = 512 << 20


@triton.jit
def _group_ends_kernel(
    cursor_ptr,  # [E] int32: pairs per expert in; each expert's first row out
    offsets_ptr,  # [E] int32: each expert's rows end here
    num_experts,
    E_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    experts = tl.arange(0, E_PAD)
    ok = experts < num_experts
    counts = tl.load(cursor_ptr + experts, mask=ok, other=0)
    ends = tl.cumsum(counts, axis=0)
    tl.debug_barrier()  # every thread has read the counts before they become cursors
    tl.store(offsets_ptr + experts, ends, mask=ok)
    tl.store(cursor_ptr + experts, ends - counts, mask=ok)


@triton.jit
def _scatter_rows_kernel(
    ids_ptr,  # [T * k] global expert ids
    rows_ptr,  # [T * k]: the token of each sorted row
    row_of_ptr,  # [T * k]: the sorted row of each pair (-1: not this rank's)
    cursor_ptr,  # [E] int32: each expert's next free row
    num_pairs,
    num_experts,
    first_expert,
    top_k,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    pairs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    local = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1) - first_expert
    mine = (pairs < num_pairs) & (local >= 0) & (local < num_experts)
    row = tl.atomic_add(cursor_ptr + local, 1, mask=mine)
    tl.store(rows_ptr + row, (pairs // top_k).to(tl.int64), mask=mine)
    tl.store(row_of_ptr + pairs, tl.where(mine, row, -1), mask=pairs < num_pairs)


def usable(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w13_bias: torch.Tensor | None,
    clamped: tuple[float, float] | None,
) -> bool:
    """Whether these experts can take the grouped GEMM: no biases, SiLU's gate, widths of
    whole 16-byte rows (its TMA loads), and either 16-bit weights of the activations' dtype
    or FP8 weights with their scales under bf16 activations (the scaled GEMM writes bf16
    only) on a GPU torch has the scaled GEMM for (Hopper, Blackwell); and a torch that has
    the GEMM."""
    _, two_i, hidden = w13.shape
    if w13_bias is not None or clamped is not None or hidden % 16 or two_i % 32:
        return False
    if w13.dtype == fp8_rows.FP8:
        return (
            w13_scale is not None
            and x.dtype == torch.bfloat16
            and hasattr(torch, "_scaled_grouped_mm")
            and w13.shape[0] < 1024  # (torch's limit on the groups)
            and (not x.is_cuda or torch.cuda.get_device_capability(x.device) in _SCALED_GPUS)
        )
    return (
        hasattr(torch, "_grouped_mm")
        and w13.dtype == x.dtype
        and x.dtype in (torch.bfloat16, torch.float16)
        and w13_scale is None
    )


def sort_rows(
    ids: torch.Tensor, num_experts: int, first_expert: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, offsets, row_of) for expert ids [T, k], with no padding (module docstring);
    rows past the last group (pairs routed to another rank) name token 0."""
    flat = ids.flatten().contiguous()
    num_pairs, top_k = flat.numel(), ids.shape[1]
    dev = flat.device
    rows = torch.zeros(num_pairs, dtype=torch.int64, device=dev)
    row_of = torch.empty(num_pairs, dtype=torch.int32, device=dev)
    offsets = torch.empty(num_experts, dtype=torch.int32, device=dev)
    cursor = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    use_pdl = pdl(dev)
    programs = triton.cdiv(num_pairs, moe_routing.SCATTER_CHUNK)
    common = dict(CHUNK=moe_routing.SCATTER_CHUNK, PDL=use_pdl, num_warps=4, launch_pdl=use_pdl)
    # pairs per expert (moe_routing's counting launch, with no padding rows to fill)
    moe_routing._count_kernel[(programs,)](
        flat, rows, cursor, num_pairs, num_experts, first_expert, 0, 0, **common
    )
    _group_ends_kernel[(1,)](
        cursor, offsets, num_experts, E_PAD=triton.next_power_of_2(num_experts),
        PDL=use_pdl, num_warps=4, launch_pdl=use_pdl,
    )  # fmt: skip
    _scatter_rows_kernel[(programs,)](
        flat, rows, row_of, cursor, num_pairs, num_experts, first_expert, top_k, **common
    )
    return rows, offsets, row_of


def combine(
    o: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * o[row_of[t * k + j]] over the pairs with a row, into
    `out` [T, H] (contiguous rows)."""
    tokens, hidden = out.shape
    top_k = weights.shape[1]
    block = min(1024, triton.next_power_of_2(hidden))
    use_pdl = pdl(o.device)
    sum_slots_kernel[(tokens, triton.cdiv(hidden, block))](
        o, row_of, weights.contiguous(), out, hidden, top_k,
        GATHER=True, BLOCK=block, PDL=use_pdl, num_warps=4, launch_pdl=use_pdl,
    )  # fmt: skip
    return out


def scaled_grouped_mm(
    a: torch.Tensor,  # [P, K] e4m3, rows sorted by expert
    a_scale: torch.Tensor,  # [P] float32: each row's scale
    w: torch.Tensor,  # [E, N, K] e4m3
    w_scale: torch.Tensor,  # [E, N] float32: each expert's output rows' scales
    offsets: torch.Tensor,  # [E] int32 group ends
) -> torch.Tensor:
    """(a * a_scale) @ (w[e] * w_scale[e])^T for each expert's group of rows: [P, N] bf16.
    CUTLASS's FP8 grouped GEMM on a GPU; on a CPU (tests: torch has no such kernel there)
    the same product from the dequantized operands in float32."""
    if a.is_cuda:
        # use_fast_accum: CUTLASS's fast FP8 schedules, which accumulate in the tensor cores'
        # own precision without promoting partial sums to float32 every few k-blocks (the
        # sweep's timings are these; the error they add at K = 14,336 was not measured apart
        # from the activations' quantization)
        return torch._scaled_grouped_mm(
            a, w.transpose(1, 2), a_scale, w_scale, offs=offsets, out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )  # fmt: skip
    a32 = a.float() * a_scale[:, None]
    w32 = (w.float() * w_scale[:, :, None]).transpose(1, 2)
    return torch._grouped_mm(a32, w32, offs=offsets).to(torch.bfloat16)


def _gather_fp8(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """q[rows] for an e4m3 tensor (gathered as bytes: index_select has no FP8 kernel)."""
    return q.view(torch.uint8).index_select(0, rows).view(q.dtype)


def grouped_mm_experts(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]: gate rows, then up
    w2: torch.Tensor,  # [E, H, I]
    ids: torch.Tensor,  # [T, k] global expert ids
    weights: torch.Tensor,  # [T, k]
    first_expert: int = 0,
    *,
    w13_scale: torch.Tensor | None = None,  # [E, 2I] float32: FP8 experts only
    w2_scale: torch.Tensor | None = None,  # [E, H] float32: FP8 experts only
) -> torch.Tensor:
    """fused_moe.fused_experts' result through torch's grouped GEMM: [T, H] in x's dtype.
    A step whose gate-up output would pass CHUNK_BYTES runs in equal chunks of tokens."""
    tokens, top_k = ids.shape
    fp8 = w13_scale is not None
    out = torch.empty((tokens, x.shape[1]), dtype=x.dtype, device=x.device)
    per_token = top_k * w13.shape[1] * x.element_size()  # bytes of gate-up output
    chunks = -(-tokens * per_token // CHUNK_BYTES)
    size = max(1, -(-tokens // max(chunks, 1)))
    for t0 in range(0, tokens, size):
        t1 = min(t0 + size, tokens)
        rows, offsets, row_of = sort_rows(ids[t0:t1], w13.shape[0], first_expert)
        if fp8:
            # per token before the gather: each token is quantized once, not once a slot
            xq, xs = fp8_rows.quantize_rows(x[t0:t1])
            xs_rows = xs.view(-1).index_select(0, rows)
            h = scaled_grouped_mm(_gather_fp8(xq, rows), xs_rows, w13, w13_scale, offsets)
            act, act_scale = fp8_rows.silu_mul_quantize(h)
            del h  # (a step's largest buffer: gone before the down GEMM's output)
            o = scaled_grouped_mm(act, act_scale.view(-1), w2, w2_scale, offsets)
        else:
            h = torch._grouped_mm(x[t0:t1].index_select(0, rows), w13.transpose(1, 2), offs=offsets)
            act = fused.silu_and_mul(h)
            del h
            o = torch._grouped_mm(act, w2.transpose(1, 2), offs=offsets)
        combine(o, row_of, weights[t0:t1], out[t0:t1])
    return out
