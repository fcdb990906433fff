"""An experiment, kept with its sweep: a Triton GEMM for decode-sized batches,
y [M, N] = x [M, K] @ W [N, K]^T with M <= 64, against cuBLAS.

At decode batch sizes a linear layer is bound by reading W once from HBM; what decides its
time is how many bytes each SM keeps in flight and how well the last wave of tiles fills
the GPU. Each program here owns BLOCK_N output columns for BLOCK_M rows and streams their W
rows through a software-pipelined K loop (num_stages tiles in flight, tensor-core dots),
with no split-K and so no reduce kernel.

Measured on an H200 (`python benchmarks/kernel_sweep.py --only skinny`, 2026-11-30, each
shape timed over weight copies that cannot stay in the L2), Llama-3.1-8B's projections:
at M = 64 its best settings tie cuBLAS over a layer stack (4.009 against 4.001 ms for 32
layers), winning only on down_proj (34.2 against 36.3 us: cuBLAS splits K and adds a
reduce); at M = 1 it loses (3.98 against 3.73 ms). So the engine does not use it; it stays
here for the next attempt (TMA loads, a persistent grid, split-K without a second kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_N, BLOCK_K, num_warps, num_stages)
DEFAULT = (32, 256, 4, 4)
MAX_M = 64


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    # Rows past M or N wrap around (valid addresses, no load masks in the loop); their
    # results are never stored.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs, eviction_policy="evict_first")  # read once
        else:
            k_ok = (k * BLOCK_K + rk) < K
            a = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y_ptrs = y_ptr + out_m.to(tl.int64)[:, None] * stride_ym + out_n[None, :]
    mask = (out_m[:, None] < M) & (out_n[None, :] < N)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, config: tuple[int, int, int, int] | None = None
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N] in x's dtype (16-bit, M <= MAX_M)."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or weight.stride(1) != 1 or x.stride(1) != 1 or not 0 < m <= MAX_M:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    block_m = block_m_for(m)
    block_n, block_k, warps, stages = config or DEFAULT
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _skinny_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x,
        weight,
        y,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        num_warps=warps,
        num_stages=stages,
    )
    return y
