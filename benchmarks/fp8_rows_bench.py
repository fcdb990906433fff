"""Time the per-row FP8 quantizer (cadence/ops/fp8_rows.py) on the GPU at a W8A8 prefill
step's shapes (CUDA-graph replay), with its default launch and with one row a program read
twice (the layout before PROGRAM_ELEMENTS): GB/s counts the 16-bit rows read once and the
e4m3 rows written, to set against the HBM's ~4.8 TB/s.

    python benchmarks/fp8_rows_bench.py
"""

from __future__ import annotations

from functools import partial

import torch
from triton.testing import do_bench_cudagraph

from cadence.ops import fp8_rows

SHAPES = {  # name: (rows, columns out, gated)
    "8,192 tokens x 2,048 (Qwen3-30B-A3B's hidden)": (8192, 2048, False),
    "8,192 tokens x 4,096 (its o_proj input; Mixtral's hidden)": (8192, 4096, False),
    "65,536 pairs x silu(768) (Qwen3-30B-A3B's experts, 8,192 tokens)": (65536, 768, True),
    "8,192 pairs x silu(14,336) (Mixtral's experts, a 4,096-token chunk)": (8192, 14336, True),
}


def one_row_two_passes(k: int, gated: bool) -> dict:
    block = min(2048 if gated else 4096, 1 << (k - 1).bit_length())
    return dict(ROWS=1, BLOCK=block, ONE_PASS=False, num_warps=4)


def main() -> None:
    for name, (rows, k, gated) in SHAPES.items():
        x = torch.randn(rows, 2 * k if gated else k, dtype=torch.bfloat16, device="cuda")
        moved = x.numel() * 2 + rows * k  # bytes: 16-bit rows in, e4m3 rows out
        line = []
        for label, config in (
            ("default", fp8_rows.launch_config(k, gated)),
            ("one row, two passes", one_row_two_passes(k, gated)),
        ):
            run = partial(fp8_rows._launch, x, k, gated, config)
            run()
            torch.cuda.synchronize()
            us = do_bench_cudagraph(run, rep=50) * 1e3
            line.append(f"{label} {config}: {us:7.1f} us, {moved / us / 1e3:5.0f} GB/s")
        print(f"{name}:\n  " + "\n  ".join(line), flush=True)


if __name__ == "__main__":
    main()
