"""Warm the GPU's L2 with a weight the step will read next, while HBM would otherwise idle.

At small decode batches a layer's attention is latency-bound: at batch 1 the attention
kernels run ~10 us on a handful of SMs and read a few hundred KB, so HBM sits idle, and
then o_proj reads its 33.5 MB (Llama-3.1-8B) from HBM. `warm_l2(o_proj.weight, tokens)`,
launched just before attention, issues Hopper's bulk L2 prefetches
(`cp.async.bulk.prefetch.L2`) for that weight and exits at once: the copy into L2 runs
during attention, and o_proj then reads from L2.

Only a hint: nothing waits for it and no result depends on it. On when the device is
Hopper or newer, the step has at most MAX_TOKENS tokens, and CADENCE_L2_PREFETCH is not 0.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MAX_TOKENS = 16  # bigger batches keep the SMs and HBM busy during attention themselves
CHUNK_BYTES = 64 * 1024  # one prefetch instruction per lane covers this much
L2_SHARE = 0.75  # at most this share of the L2 is asked for at once


@triton.jit
def _l2_prefetch_kernel(ptr, n_bytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    start = lane.to(tl.int64) * CHUNK
    size = tl.minimum(n_bytes - start, CHUNK)
    live = size > 0
    # Lanes past the end prefetch the first 16 bytes again (harmless) rather than branch.
    start = tl.where(live, start, 0)
    size = tl.where(live, size, 16).to(tl.int32)
    addr = ptr.to(tl.pointer_type(tl.uint8)) + start
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@functools.cache
def _l2_budget(device: torch.device) -> int:
    """Bytes to prefetch at most on this device, or 0 where prefetching is off."""
    if (
        device.type != "cuda"
        or os.environ.get("CADENCE_L2_PREFETCH", "1") == "0"
        or torch.cuda.get_device_capability(device)[0] < 9
    ):
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(props.L2_cache_size * L2_SHARE) // 16 * 16


def warm_l2(weight: torch.Tensor, num_tokens: int) -> None:
    """Ask the L2 for (the head of) `weight` if this step is small enough to leave HBM
    idle during attention; returns at once."""
    if num_tokens > MAX_TOKENS or not weight.is_cuda:
        return
    budget = _l2_budget(weight.device)
    if not budget or not weight.is_contiguous() or weight.data_ptr() % 16:
        return
    n_bytes = min(weight.numel() * weight.element_size(), budget) // 16 * 16
    if n_bytes == 0:
        return
    lanes = 32
    _l2_prefetch_kernel[(triton.cdiv(triton.cdiv(n_bytes, CHUNK_BYTES), lanes),)](
        weight, n_bytes, CHUNK=CHUNK_BYTES, LANES=lanes, num_warps=1
    )
