"""FP8 products against bf16 at Llama-3.1-8B's linear shapes, by batch rows (CUDA).

    python benchmarks/fp8_gemm_sweep.py [--rows 1,8,64,256] [--json PATH]

Per shape and M (rows of activations), each replayed in a CUDA graph of 20 calls over
enough weight copies to exceed the 50 MB L2 (so every weight byte comes from HBM, as in a
real step):
    bf16        F.linear, cuBLAS
    fp8 mm      per-token activation quantization (Triton) + torch._scaled_mm (rowwise)
    mm alone    torch._scaled_mm on already-quantized activations
    gemv        the Triton e4m3 gemv against 16-bit activations (M = 1 only)
    triton mm   per-token quantization + fp8_kernels.fp8_mm (Triton's W8A8 GEMM), for
                each tile config of MM_CONFIGS (M >= 8). (A tensor-core kernel on 16-bit
                activations, "skinny", lost to it at every M measured and was removed:
                benchmarks/results/h200/q17_s3_quant.log has its rows.)
Microseconds a call, the best config, and fp8's speed-up over bf16; what
`Fp8LinearMethod` picks per M follows from it.
"""

from __future__ import annotations

import argparse
import json

import torch

GEMV_CONFIGS = [  # (BLOCK_N, BLOCK_K, UNROLL, num_warps)
    (16, 512, 1, 8),
    (8, 512, 4, 4),
    (16, 512, 4, 8),
    (8, 1024, 2, 4),
    (4, 1024, 4, 4),
    (16, 256, 4, 4),
    (4, 512, 4, 2),
]
MM_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    (64, 64, 128, 4, 4),
    (64, 128, 128, 4, 4),
    (64, 64, 256, 4, 3),
    (64, 32, 256, 4, 4),
    (128, 64, 128, 4, 4),
    (64, 128, 128, 8, 3),
    (128, 128, 128, 8, 3),
]
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def graph_time(fn, calls: int = 20, reps: int = 10) -> float:
    """Microseconds a call, from a CUDA graph of `calls` calls replayed `reps` times."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * reps)


def timed(fn) -> float:
    """graph_time, or infinity for a config that does not fit (shared memory)."""
    try:
        return graph_time(fn)
    except Exception as e:  # noqa: BLE001 (triton's OutOfResources and kin)
        print(f"  skipped: {type(e).__name__}", flush=True)
        return float("inf")


class Rotating:
    """Hands out the next of several weight copies at each call (L2 never holds them)."""

    def __init__(self, items: list) -> None:
        self.items, self.i = items, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.items)
        return self.items[self.i]


def sweep_shape(name: str, n: int, k: int, rows: list[int]) -> list[dict]:
    from cadence.quant import fp8_kernels as fk

    copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # > 400 MB of bf16 weights in all
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    qs = [fk.quantize_weight(w) for w in ws]
    bf16, fp8 = Rotating(ws), Rotating(qs)
    results = []
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = fk.quantize_per_token(x)

        def fp8_mm(x=x):
            w, s = fp8()
            a, b = fk.quantize_per_token(x)
            return fk.scaled_mm(a, b, w, s.view(1, -1), None, torch.bfloat16)

        def mm_alone(xq=xq, xs=xs):
            w, s = fp8()
            return fk.scaled_mm(xq, xs, w, s.view(1, -1), None, torch.bfloat16)

        row = {"shape": name, "n": n, "k": k, "m": m}
        row["bf16_us"] = graph_time(lambda x=x: torch.nn.functional.linear(x, bf16()))
        row["fp8_mm_us"] = graph_time(fp8_mm)
        row["mm_alone_us"] = graph_time(mm_alone)
        if m == 1:
            w0, s0 = qs[0]
            want = x.float() @ (w0.float() * s0[:, None]).t()
            got = fk.fp8_gemv(x, w0, s0, None).float()
            row["gemv_rel_err"] = float((got - want).abs().max() / want.abs().max())
            times = {
                c: timed(lambda x=x, c=c: fk.fp8_gemv(x, *fp8(), None, c)) for c in GEMV_CONFIGS
            }
            best_cfg = min(times, key=times.get)
            row["gemv_us"], row["gemv_config"] = times[best_cfg], list(best_cfg)
        if m >= 8:
            w0, s0 = qs[0]
            want = (xq.float() * xs) @ (w0.float() * s0[:, None]).t()
            got = fk.fp8_mm(xq, xs, w0, s0, None, torch.bfloat16).float()
            row["mm_rel_err"] = float((got - want).abs().max() / want.abs().max())

            def triton_mm(x=x, c=None):
                w, s = fp8()
                a, b = fk.quantize_per_token(x)
                return fk.fp8_mm(a, b, w, s, None, torch.bfloat16, c)

            times = {c: timed(lambda c=c: triton_mm(c=c)) for c in MM_CONFIGS}
            best_cfg = min(times, key=times.get)
            row["triton_mm_us"], row["triton_mm_config"] = times[best_cfg], list(best_cfg)
        floor_us = n * k / 4.3e6  # e4m3 bytes at 4.3 TB/s
        best = min(v for key, v in row.items() if key.endswith("_us") and key != "bf16_us")
        row["speedup"] = row["bf16_us"] / best
        results.append(row)
        extra = ""
        if "gemv_us" in row:
            extra = f" gemv {row['gemv_us']:6.1f} {tuple(row['gemv_config'])}"
        if "triton_mm_us" in row:
            extra += f" triton mm {row['triton_mm_us']:6.1f} {tuple(row['triton_mm_config'])}"
        print(f"{name:8s} M={m:4d}: bf16 {row['bf16_us']:6.1f} us  fp8 mm {row['fp8_mm_us']:6.1f}"
              f" (alone {row['mm_alone_us']:6.1f}){extra}  floor {floor_us:5.1f}"
              f" -> {row['speedup']:.2f}x", flush=True)  # fmt: skip
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,16,32,64,128,256")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    for name, (n, k) in SHAPES.items():
        results += sweep_shape(name, n, k, rows)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
