"""A Triton matmul over 4-bit planes (cadence/quant/gguf_blocks.py), dequantizing as it
streams the weight: y = x W^T with

    W[n, k] = sum_p (q[p, n, k] - 8) * scale[p, n, k // g] + zero[n, k // g]

Layout (what `pack` builds from a Planes): q as nibbles, two columns a byte (column 2i in
the low nibble, 2i + 1 in the high one), [P, N, K / 2] uint8; scale [P, N, K / g] and zero
[N, K / g] in float32. Each program owns a BLOCK_M x BLOCK_N tile of y and walks K in
BLOCK_K steps: it loads the x tile and each plane's bytes, expands them to the weight tile in
registers and multiplies on the tensor cores (fp32 accumulate). The weight is read once
from memory at 4 bits a plane, which is what makes a small batch's step short.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from cadence.quant.gguf_blocks import Planes

# Triton's interpreter multiplies bf16 blocks as raw integers (triton 3.9): under it the
# products run in fp32 on the same values.
_INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _int4_planes_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    z_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    PLANES: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    half_k = K // 2
    groups = K // GROUP
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_ok[:, None], other=0.0)
        rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        rg = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        z = tl.load(z_ptr + rn[:, None] * groups + rg[None, :], mask=n_ok[:, None], other=0.0)
        w = tl.broadcast_to(z[:, :, None], [BLOCK_N, BLOCK_K // GROUP, GROUP])
        for p in tl.static_range(PLANES):
            b = tl.load(
                q_ptr + p * N * half_k + rn[:, None].to(tl.int64) * half_k + rb[None, :],
                mask=n_ok[:, None],
                other=8 | (8 << 4),
                eviction_policy="evict_first",
            )
            nib = tl.join(b & 15, b >> 4).reshape([BLOCK_N, BLOCK_K])  # column 2i, 2i + 1
            s = tl.load(
                s_ptr + p * N * groups + rn[:, None] * groups + rg[None, :],
                mask=n_ok[:, None],
                other=0.0,
            )
            q = (nib.to(tl.float32) - 8.0).reshape([BLOCK_N, BLOCK_K // GROUP, GROUP])
            w += q * s[:, :, None]
        w = w.reshape([BLOCK_N, BLOCK_K]).to(x.dtype)
        if IEEE:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


class Int4Planes(torch.nn.Module):
    """A weight [N, K] as nibble planes on a CUDA device (or under Triton's interpreter)."""

    def __init__(self, planes: Planes, device: torch.device) -> None:
        super().__init__()
        p, n, k = planes.q.shape
        q = planes.q.to(torch.uint8)
        packed = (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()
        self.register_buffer("q", packed.to(device))
        self.register_buffer("scale", planes.scale.contiguous().to(device))
        self.register_buffer("zero", planes.zero.contiguous().to(device))
        self.group = planes.group
        self.out_features, self.in_features = n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        n = self.out_features
        if k != self.in_features:
            raise ValueError(f"input of {k} features for a [{n}, {self.in_features}] weight")
        x = x.contiguous()
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        block_k = 128 if k % 128 == 0 else 64 if k % 64 == 0 else 32
        block_k = max(block_k, self.group)
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
        block_n = 64 if m <= 32 else 128
        grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
        _int4_planes_kernel[grid](
            x,
            self.q,
            self.scale,
            self.zero,
            y,
            m,
            n,
            k,
            x.stride(0),
            y.stride(0),
            PLANES=self.q.shape[0],
            GROUP=self.group,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            IEEE=x.dtype == torch.float32 or _INTERPRETER,
            num_warps=4,
            num_stages=3,
        )
        return y

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """W[index] in `dtype` (the embedding lookup), expanded for those rows only."""
        b = self.q[:, index]  # [P, T, K / 2]
        nib = torch.stack([b & 15, b >> 4], dim=-1).flatten(-2).float() - 8
        p, t, k = nib.shape
        g = self.group
        w = (nib.view(p, t, k // g, g) * self.scale[:, index, :, None]).sum(0)
        return (w + self.zero[index][..., None]).view(t, k).to(dtype)
