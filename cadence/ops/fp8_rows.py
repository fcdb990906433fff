"""Rows of 16-bit activations to FP8 (e4m3), each row with its own float32 scale (per-token
activations: the W8A8 GEMMs' left operand).

    quantize_rows(x)        x [M, K] -> (e4m3 [M, K], float32 scales [M, 1]): each row
                            scaled so its largest magnitude is FP8_MAX
    silu_mul_quantize(h)    [gate | up] rows [M, 2D] -> the rows of silu(gate) * up, quantized
                            as quantize_rows does, without the 16-bit activation ever
                            reaching memory (a W8A8 expert MLP's down GEMM takes these)

silu(gate) * up is rounded as `fused.silu_and_mul` rounds it (the activation, then the
product, each to the input's dtype) before it is scaled, so the only difference from the
16-bit path is the quantization. A row that fits one pass (up to PROGRAM_ELEMENTS, half
that gated) stays in registers between its maximum and its scaling, several such rows a
program; a wider one is read twice (the second time mostly from L2). On a CPU the same
math runs through torch.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 1e-12  # an all-zero row still gets a finite scale

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install may lack triton: the torch paths serve
    triton = None


def _use_triton(x: torch.Tensor) -> bool:
    # (not under Triton's interpreter: its casts to e4m3 round unlike the GPU's and torch's)
    return triton is not None and x.is_cuda


if triton is not None:

    @triton.jit
    def _row_values(x_rows, row_ok, cols, K, GATED: tl.constexpr):
        """float32 values [ROWS, BLOCK] of the rows `x_rows` (pointers [ROWS, 1]) at columns
        `cols`: the rows themselves, or silu(gate) * up of [gate | up] rows of width 2K
        (rounded as fused.silu_and_mul)."""
        mask = row_ok[:, None] & (cols < K)[None, :]
        if GATED:
            gate = tl.load(x_rows + cols[None, :], mask=mask, other=0.0)
            up = tl.load(x_rows + K + cols[None, :], mask=mask, other=0.0)
            g = gate.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
            return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)
        return tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _row_scale(amax):
        # amax / FP8_MAX as torch computes it on a GPU (a tensor over a scalar: times the
        # scalar's reciprocal), at least MIN_SCALE
        return tl.maximum(amax * (1.0 / 448.0), 1e-12)

    @triton.jit
    def _scaled(v, scale):
        # (IEEE division, as torch's: `/` compiles to an approximate one, whose last bit
        # can move a value across an e4m3 rounding boundary)
        return tl.clamp(tl.math.div_rn(v, scale[:, None]), -448.0, 448.0)

    @triton.jit
    def _quant_rows_kernel(
        x_ptr,
        q_ptr,
        s_ptr,
        M,  # rows
        K,  # columns out (a gated row has 2K in)
        stride_x,
        stride_q,
        GATED: tl.constexpr,
        ROWS: tl.constexpr,  # rows a program
        BLOCK: tl.constexpr,  # columns a pass; ONE_PASS: the whole row (K <= BLOCK)
        ONE_PASS: tl.constexpr,
    ):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < M
        x_rows = x_ptr + rows[:, None] * stride_x
        q_rows = q_ptr + rows[:, None] * stride_q
        if ONE_PASS:  # the rows stay in registers between their maximum and their scaling
            cols = tl.arange(0, BLOCK)
            v = _row_values(x_rows, row_ok, cols, K, GATED)
            scale = _row_scale(tl.max(tl.abs(v), 1))
            tl.store(s_ptr + rows, scale, mask=row_ok)
            q = _scaled(v, scale).to(q_ptr.dtype.element_ty)
            tl.store(q_rows + cols[None, :], q, mask=row_ok[:, None] & (cols < K)[None, :])
        else:  # wide rows: read twice (the second time mostly from L2)
            amax = tl.zeros([ROWS, BLOCK], tl.float32)
            for k0 in range(0, K, BLOCK):
                cols = k0 + tl.arange(0, BLOCK)
                amax = tl.maximum(amax, tl.abs(_row_values(x_rows, row_ok, cols, K, GATED)))
            scale = _row_scale(tl.max(amax, 1))
            tl.store(s_ptr + rows, scale, mask=row_ok)
            for k0 in range(0, K, BLOCK):
                cols = k0 + tl.arange(0, BLOCK)
                v = _row_values(x_rows, row_ok, cols, K, GATED)
                q = _scaled(v, scale).to(q_ptr.dtype.element_ty)
                tl.store(q_rows + cols[None, :], q, mask=row_ok[:, None] & (cols < K)[None, :])


def quantize_rows_torch(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows in torch, for any device and dtype (a CPU's path; the weights' at load)."""
    s = (v.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    return (v.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


# Elements of a row a program holds (a gated program reads twice this: gate and up): narrow
# rows go several to a program, so each moves enough bytes to keep the memory system busy
# (one 2,048-wide row a program is latency-bound).
PROGRAM_ELEMENTS = 4096


def launch_config(k: int, gated: bool) -> dict:
    """The kernel's constexprs and warps for rows of k columns out."""
    block = min(PROGRAM_ELEMENTS // 2 if gated else PROGRAM_ELEMENTS, triton.next_power_of_2(k))
    one_pass = k <= block
    rows = max(1, PROGRAM_ELEMENTS // block) if one_pass else 1
    warps = 8 if rows * block >= 4096 else 4
    return dict(ROWS=rows, BLOCK=block, ONE_PASS=one_pass, num_warps=warps)


def _launch(
    x: torch.Tensor, k: int, gated: bool, config: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.stride(1) != 1:  # (the kernel steps through a row's columns one element apart)
        x = x.contiguous()
    m = x.shape[0]
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        config = config or launch_config(k, gated)
        _quant_rows_kernel[(triton.cdiv(m, config["ROWS"]),)](
            x, q, s, m, k, x.stride(0), q.stride(0), GATED=gated, **config
        )
    return q, s


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] 16-bit -> (e4m3 [M, K], float32 scales [M, 1])."""
    if _use_triton(x):
        return _launch(x, x.shape[1], gated=False)
    return quantize_rows_torch(x)


def silu_mul_quantize(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[gate | up] rows [M, 2D] 16-bit -> quantize_rows(silu(gate) * up): (e4m3 [M, D],
    float32 scales [M, 1])."""
    d = h.shape[1] // 2
    if _use_triton(h):
        return _launch(h, d, gated=True)
    gate, up = h[:, :d], h[:, d:]
    return quantize_rows_torch(torch.nn.functional.silu(gate) * up)
