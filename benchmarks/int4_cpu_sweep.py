"""The CPU int4 products by rows of activations: torch's packed kernel against expanding
the weight and multiplying in bf16 (SmolLM2-135M's shapes, this machine's threads).

    python benchmarks/int4_cpu_sweep.py

Prints milliseconds a call for the packed kernel, expand + GEMM, and the bf16 GEMM alone
(what a plain bf16 model pays), per M; `int4_cpu.DEQUANT_ROWS` is where expanding wins.
"""

from __future__ import annotations

import time

import torch

from cadence.quant import int4_cpu
from cadence.quant.gguf_blocks import Planes

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def ms(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        planes = Planes(
            torch.randint(0, 16, (1, n, k), dtype=torch.uint8),
            torch.rand(1, n, k // 32) * 0.01,
            torch.randn(n, k // 32) * 0.01,
            32,
        )
        kernel = int4_cpu.Int4PackCPU(planes, torch.bfloat16)
        w = kernel.dequantize()
        for m in (1, 4, 8, 16, 32, 64, 128, 512, 2048):
            x = torch.randn(m, k, dtype=torch.bfloat16)
            reps = max(3, 2000 // m)
            packed = ms(lambda x=x, kn=kernel: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, kn.packed0, 32, kn.sz0), reps)  # fmt: skip
            # what Int4PackCPU.forward does past DEQUANT_ROWS: W^T expanded, then one GEMM
            expand = ms(lambda x=x, kn=kernel: torch.mm(x, kn.dequantize(transposed=True)), reps)
            plain = ms(lambda x=x, w=w: torch.nn.functional.linear(x, w), reps)
            print(f"{name:8s} M={m:5d}: packed {packed:7.3f} ms  expand+gemm {expand:7.3f} ms"
                  f"  bf16 gemm {plain:7.3f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
