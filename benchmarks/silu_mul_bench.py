"""Time fused.silu_and_mul on the GPU at the expert activations of a prefill step (CUDA-graph
replay): GB/s counts the [gate | up] rows read and the output written once, to set against
the HBM's ~4.8 TB/s (whether the kernel is worth a rewrite, or its time in a profile is
just its bytes).

    python benchmarks/silu_mul_bench.py
"""

from __future__ import annotations

from functools import partial

import torch
from triton.testing import do_bench_cudagraph

from cadence.ops import fused

SHAPES = {  # name: (rows = tokens x top-k, intermediate size)
    "Mixtral-8x7B, 4,096-token chunk": (4096 * 2, 14336),
    "Qwen3-30B-A3B, 8,192 tokens": (8192 * 8, 768),
    "Llama-3.1-8B MLP, 8,192 tokens": (8192, 14336),
}


def main() -> None:
    for name, (rows, d) in SHAPES.items():
        x = torch.randn(rows, 2 * d, dtype=torch.bfloat16, device="cuda")
        moved = 3 * rows * d * 2  # bytes: gate and up read, the product written
        fused.silu_and_mul(x)
        torch.cuda.synchronize()
        us = do_bench_cudagraph(partial(fused.silu_and_mul, x), rep=50) * 1e3
        print(f"{name}: {us:7.1f} us, {moved / us / 1e3:5.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
