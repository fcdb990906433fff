"""A Triton matrix-vector product for single-row linear layers (batch-1 decode).

At batch 1 a decode step is one pass over the weights: every linear layer is y = W x with
W [N, K] read once from HBM, so its time is its bytes over the bandwidth. cuBLAS reaches
~90 % of that on the large projections but less on the small ones (qkv, o_proj of an 8B
model: ~8-12 us kernels where a split-K reduce and ramp-up show). Here each program owns
BLOCK_N output rows, streams their K columns in BLOCK_K tiles (a 2-D fp32 accumulator,
reduced once at the end) and writes BLOCK_N outputs: no split-K, no second kernel.

Used only where it measured faster; CUDA only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Module constants, so a sweep can set them. benchmarks/kernel_sweep.py on an H200, Llama-3.1-8B's o_proj [4096 x 4096]: 7.8 us against
# cuBLAS's 10.4 us when replayed alone (its 33.5 MB stay in the 50 MB L2, so both figures are
# flattering); inside a decode step, where every weight comes from HBM, 11.5 us against
# ~12.5 us (cuBLAS's split-K kernel plus its reduce). On qkv, gate_up, down and the LM head
# it only tied or lost, so only the attention output projection uses it (models/llama.py).
BLOCK_N = 16
BLOCK_K = 1024
NUM_WARPS = 8
NUM_STAGES = 3


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    N,
    K,
    stride_wn,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        # Weights are read exactly once: do not let them push x out of the cache.
        w = tl.load(
            w_rows + cols[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0.0,
            eviction_policy="evict_first",
        )
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [1, K] @ weight[N, K]^T (+ bias) -> [1, N], in x's dtype."""
    n, k = weight.shape
    if x.shape != (1, k) or weight.stride(1) != 1 or x.stride(-1) != 1:
        raise ValueError(f"gemv wants x [1, {k}] and a row-major weight, got {tuple(x.shape)}")
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        n,
        k,
        weight.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return y
