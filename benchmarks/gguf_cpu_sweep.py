"""The CPU weight products at 1, 4, 16 and 64 rows (issue 38's kernel figures): GB/s of weight
bytes read and GFLOP/s, for the GGUF panels (cadence/quant/gguf_cpu.py: "panels" as served:
int8 activations, and from 16 rows the AMX-BF16 tiles where the CPU has them;
"panels-int8" without those tiles; "panels-float" the float path) and torch's packed
int4 kernel they replace (cadence/quant/int4_cpu.py), and for plain bf16 weights the panels
(plain_cpu.py) against torch's F.linear, on SmolLM2-135M's shapes, set against the
machine's measured memory bandwidth (a float32 sum over 256 MiB).

    .venv/bin/python benchmarks/gguf_cpu_sweep.py [--json OUT] [--threads N]

Random codes of the model's formats (Q4_1 layers, the Q8_0 vocabulary as the LM head);
bf16 activations, as `cadence serve` runs them. Per row count: ms per call, then the whole
decode step's weight products (30 layers + the head) in ms.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
import torch.nn.functional as F

from cadence.quant import gguf_cpu
from cadence.quant.gguf_blocks import Codes, to_planes
from cadence.quant.gguf_cpu import PanelsCPU
from cadence.quant.int4_cpu import Int4PackCPU

LAYERS = 30
SHAPES = {  # name: (out, in, bits), SmolLM2-135M
    "qkv": (960, 576, 4),
    "o": (576, 576, 4),
    "gate_up": (3072, 576, 4),
    "down": (576, 1536, 4),
    "lm_head": (49152, 576, 8),
}
ROWS = (1, 4, 16, 64)
KERNELS = ("panels", "panels-int8", "panels-float", "int4", "bf16-panels", "bf16-linear")


def random_codes(n: int, k: int, bits: int, group: int = 32) -> Codes:
    v = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8)
    s = (torch.rand(n, k // group) * 0.01).half().float()
    c = (-torch.rand(n, k // group) * 0.05).half().float()
    return Codes(v, s, c, group, bits)


def build(kernel_name: str, codes: Codes, plain: torch.Tensor):
    """One kernel of KERNELS for a weight, as its codes and as a plain bf16 tensor."""
    if kernel_name in ("panels", "panels-int8", "panels-float"):
        panels = PanelsCPU(codes)
        panels.int8_activations &= kernel_name != "panels-float"
        panels.bf16_tiles &= kernel_name == "panels"
        return panels
    if kernel_name == "int4":
        return Int4PackCPU(to_planes(codes), torch.bfloat16)
    if kernel_name == "bf16-panels":
        return PanelsCPU.from_plain(plain)
    return functools.partial(F.linear, weight=plain)


def seconds(fn, x: torch.Tensor, budget: float = 0.3) -> float:
    fn(x)
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget or reps < 3:
        fn(x)
        reps += 1
    return elapsed / reps


def memory_bandwidth() -> float:
    """GB/s of a float32 sum over 256 MiB (every thread of the pool)."""
    x = torch.ones(64 * 2**20)
    return x.numel() * 4 / seconds(torch.sum, x) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument(
        "--expand-rows",
        type=int,
        default=gguf_cpu.EXPAND_ROWS,
        help="rows from which the panels expand W^T for oneDNN's GEMM (a crossover sweep)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gguf_cpu.EXPAND_ROWS = args.expand_rows
    bandwidth = memory_bandwidth()
    print(f"threads {args.threads}, memory bandwidth {bandwidth:.1f} GB/s")
    rows_out, step = [], {}
    for name in args.shapes:
        n, k, bits = SHAPES[name]
        codes = random_codes(n, k, bits)
        plain = torch.randn(n, k).mul(0.02).bfloat16()
        for kernel_name in args.kernels:
            kernel = build(kernel_name, codes, plain)
            if kernel_name == "bf16-linear":
                weight_bytes = plain.numel() * plain.element_size()
            else:
                weight_bytes = sum(b.numel() * b.element_size() for b in kernel.buffers())
            for m in args.rows:
                if (
                    kernel_name == "int4"
                    and m >= 48
                    and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
                ):
                    continue  # its expansion runs oneDNN's bf16 reference loop here: minutes
                t = seconds(kernel, torch.randn(m, k).to(torch.bfloat16))
                calls = 1 if name == "lm_head" else LAYERS
                step[(kernel_name, m)] = step.get((kernel_name, m), 0.0) + t * calls
                row = {
                    "shape": name,
                    "kernel": kernel_name,
                    "rows": m,
                    "ms": t * 1e3,
                    "GB/s": weight_bytes / t / 1e9,
                    "GFLOP/s": 2 * m * n * k / t / 1e9,
                }
                rows_out.append(row)
                print(
                    f"{name:8s} {kernel_name:11s} rows {m:3d}: {row['ms']:8.3f} ms "
                    f"{row['GB/s']:6.2f} GB/s ({row['GB/s'] / bandwidth:5.1%} of memory) "
                    f"{row['GFLOP/s']:6.1f} GFLOP/s"
                )
    print("a decode step's weight products (30 layers + head), ms:")
    for (kernel_name, m), t in sorted(step.items()):
        print(f"  {kernel_name:11s} rows {m:3d}: {t * 1e3:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "bandwidth_gbps": bandwidth,
                    "threads": args.threads,
                    "rows": rows_out,
                    "step_ms": {f"{k}@{m}": t * 1e3 for (k, m), t in step.items()},
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
