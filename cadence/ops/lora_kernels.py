"""LoRA's two products for a batch that mixes adapters, in Triton: one launch each per
projection whatever the number of adapters, graph-capturable (shapes and grid fixed by
the batch's token count; which tokens read which slot is data, `order` and `tiles`).

    shrink   s[t] = x[t] @ A[slot(t)]          A: [slots, in, R]   s: [T, R] float32
    expand   y[t] += s[t] @ B[slot(t)]         B: [slots, R, out]  (the scale folded in)

`order` lists the step's adapter tokens grouped by slot; `tiles` cuts each slot's run
into tiles of up to BLOCK_M tokens, (slot, start, end) into `order`, one program each (and
-1 for the tiles the step does not need: the grid is sized for the worst case), so an
adapter's weights are read once per tile of its tokens, not once per token. Tokens of the
base model are in no tile and untouched. The shrink splits its long reduction (the
projection's input features) over the grid's second axis, each split writing a plane of
partial sums the expand adds up: at decode a slot has a few tokens, and without the split
a step would run one program per adapter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cadence.ops.lora_tiles import BLOCK_M, max_tiles

BLOCK_K = 64
BLOCK_N = 128


@triton.jit
def _tokens(tiles_ptr, order_ptr, BLOCK_M: tl.constexpr):
    """The rows of this program's tile (a tile with work: see the callers) and which
    of the BLOCK_M lanes hold one."""
    t = tl.program_id(0)
    start = tl.load(tiles_ptr + 3 * t + 1)
    end = tl.load(tiles_ptr + 3 * t + 2)
    rows = start + tl.arange(0, BLOCK_M)
    in_tile = rows < end
    tok = tl.load(order_ptr + rows, mask=in_tile, other=0).to(tl.int64)
    return tok, in_tile


@triton.jit
def _shrink(
    x_ptr,
    a_ptr,
    s_ptr,
    order_ptr,
    tiles_ptr,
    T,
    K,
    stride_x,
    stride_a,
    k_per_split,
    R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32: tl.constexpr,
):
    slot = tl.load(tiles_ptr + 3 * tl.program_id(0))
    if slot < 0:
        return  # (a tile the step does not need)
    tok, in_tile = _tokens(tiles_ptr, order_ptr, BLOCK_M)
    split = tl.program_id(1)
    r = tl.arange(0, R)
    a_base = a_ptr + slot.to(tl.int64) * stride_a
    acc = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    k_lo = split * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            x_ptr + tok[:, None] * stride_x + ks[None, :],
            mask=in_tile[:, None] & k_ok[None, :],
            other=0.0,
        )
        a = tl.load(a_base + ks[:, None] * R + r[None, :], mask=k_ok[:, None], other=0.0)
        if FP32:
            acc += tl.dot(x, a, input_precision="ieee")
        else:
            acc += tl.dot(x, a)
    # each split's partial sums to a plane of its own: no atomics, no zeroing
    at = s_ptr + (split * T + tok[:, None]) * R + r[None, :]
    tl.store(at, acc, mask=in_tile[:, None])


@triton.jit
def _expand(
    s_ptr,
    b_ptr,
    y_ptr,
    order_ptr,
    tiles_ptr,
    T,
    N,
    splits,
    stride_y,
    stride_b,
    R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32: tl.constexpr,
):
    slot = tl.load(tiles_ptr + 3 * tl.program_id(0))
    if slot < 0:
        return  # (a tile the step does not need)
    tok, in_tile = _tokens(tiles_ptr, order_ptr, BLOCK_M)
    r = tl.arange(0, R)
    s = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    for split in range(0, splits):
        at = s_ptr + (split * T + tok[:, None]) * R + r[None, :]
        s += tl.load(at, mask=in_tile[:, None], other=0.0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < N
    b = tl.load(
        b_ptr + slot.to(tl.int64) * stride_b + r[:, None] * N + ns[None, :],
        mask=n_ok[None, :],
        other=0.0,
    )
    if FP32:
        d = tl.dot(s, b, input_precision="ieee")
    else:
        d = tl.dot(s.to(b.dtype), b)
    at = y_ptr + tok[:, None] * stride_y + ns[None, :]
    keep = in_tile[:, None] & n_ok[None, :]
    y = tl.load(at, mask=keep, other=0.0)
    tl.store(at, (y.to(tl.float32) + d).to(y.dtype), mask=keep)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _splits(k: int, tiles: int, num_sms: int) -> tuple[int, int]:
    """(splits, reduction features per split, a multiple of BLOCK_K): enough programs to
    fill the GPU twice over, at most 8 planes of partial sums (the expand reads them all)."""
    splits = max(1, min(_cdiv(k, BLOCK_K), _cdiv(2 * num_sms, max(tiles, 1)), 8))
    per = _cdiv(_cdiv(k, splits), BLOCK_K) * BLOCK_K
    return _cdiv(k, per), per


_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # (Triton's interpreter, in tests)
    index = device.index or 0
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def shrink_buffer(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Where lora_shrink writes: [splits, T, R] float32 partial sums."""
    t, k = x.shape
    splits, _ = _splits(k, _cdiv(t, BLOCK_M) + 1, _num_sms(x.device))
    return torch.empty((splits, t, a.shape[-1]), dtype=torch.float32, device=x.device)


def lora_shrink(
    x: torch.Tensor, a: torch.Tensor, order: torch.Tensor, tiles: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    """The planned tokens' x A[slot] into `s` (shrink_buffer's; rows of tokens of no
    adapter are left unwritten). x [T, in] (stride 1 along features); a [slots, in, R]
    contiguous, R a power of two >= 16; `order` and `tiles` as LoRABatch plans them (the
    grid covers max_tiles(T, slots) tiles, so it is fixed for a given T)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, k = x.shape
    slots, _, r = a.shape
    splits, per = _splits(k, _cdiv(t, BLOCK_M) + 1, _num_sms(x.device))
    assert s.shape == (splits, t, r)
    _shrink[(max_tiles(t, slots), splits)](
        x, a, s, order, tiles, t, k, x.stride(0), a.stride(0), per, r, BLOCK_M, BLOCK_K,
        x.dtype == torch.float32,
    )  # fmt: skip
    return s


def lora_expand(
    y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, order: torch.Tensor, tiles: torch.Tensor
) -> None:
    """y[t] += (the sum of s's planes)[t] @ b[slot] for the planned tokens, in place.
    y [T, out] (stride 1 along features); b [slots, R, out] contiguous."""
    splits, t, r = s.shape
    slots, _, n = b.shape
    _expand[(max_tiles(t, slots), _cdiv(n, BLOCK_N))](
        s, b, y, order, tiles, t, n, splits, y.stride(0), b.stride(0), r, BLOCK_M, BLOCK_N,
        y.dtype == torch.float32,
    )  # fmt: skip
