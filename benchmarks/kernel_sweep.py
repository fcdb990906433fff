"""Sweep launch settings of two decode-step kernels on the GPU (CUDA graph replay times).

    python benchmarks/kernel_sweep.py [--json PATH]

1. Kernel B of the Triton attention backend on decode-only batches (what a CUDA graph of
   a decode step runs): BLOCK_N x warps x stages, against the KV bytes each batch must read.
2. cadence.ops.gemv (batch-1 linear layers) against torch's F.linear (cuBLAS) on
   Llama-3.1-8B's projection shapes: BLOCK_N x BLOCK_K x warps x stages.
3. benchmarks/skinny_gemm.py (decode-batch linear layers, M = 1 and 64) against cuBLAS on
   the same shapes, each timed over enough weight copies that they cannot sit in the L2
   (as in a decode step, where every weight byte comes from HBM).
Prints each case's best settings and its bandwidth; the module constants take the winners.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from functools import partial
from types import SimpleNamespace

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, "benchmarks")
import skinny_gemm as sg  # noqa: E402
from attention_kernels import make_step  # noqa: E402

import cadence.attention.triton_paged as tp  # noqa: E402
import cadence.ops.gemv as gv  # noqa: E402


def graph_ms(fn, rep: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep)


def sweep_attention(results: dict) -> None:
    args = SimpleNamespace(block_size=16, kv_heads=8, heads=32, head_dim=128, dtype="bfloat16")
    cases = [(1, 141), (1, 384), (64, 141), (64, 384), (256, 256), (256, 1152)]
    configs = list(itertools.product((16, 32, 64, 128), (2, 4, 8), (2, 3, 4)))
    defaults = tp.DECODE_SMALL, tp.DECODE_LARGE
    for b, ctx in cases:
        torch.manual_seed(0)
        q, k, v, cache, meta = make_step([1] * b, [ctx] * b, args)
        backend = tp.TritonAttentionBackend(num_kv_heads=8, split_kv=False)
        m = backend.build(meta())
        kv_bytes = b * ctx * 8 * 128 * 2 * 2
        rows = []
        for bn, w, s in configs:
            tp.DECODE_SMALL = tp.DECODE_LARGE = (bn, w, s)
            try:
                ms = graph_ms(partial(backend.forward, q, k, v, cache, m, 128**-0.5))
            except Exception as e:  # out of shared memory etc.
                print(f"  attn b{b} ctx{ctx} {bn}/{w}/{s}: {type(e).__name__}", flush=True)
                continue
            rows.append((ms, bn, w, s))
        rows.sort()
        want = defaults[1] if b >= tp.DECODE_LARGE_BATCH else defaults[0]
        default = next(r for r in rows if r[1:] == want)
        best = rows[0]
        print(
            f"attention decode b={b:3d} ctx={ctx:4d}: default {default[0] * 1e3:7.1f} us "
            f"({kv_bytes / default[0] / 1e6:5.0f} GB/s); best {best[0] * 1e3:7.1f} us "
            f"({kv_bytes / best[0] / 1e6:5.0f} GB/s) at BLOCK_N {best[1]}, warps {best[2]}, "
            f"stages {best[3]}; next {[(round(r[0] * 1e3, 1), *r[1:]) for r in rows[1:4]]}",
            flush=True,
        )
        results[f"attn_b{b}_ctx{ctx}"] = [(r[0] * 1e3, *r[1:]) for r in rows]
    tp.DECODE_SMALL, tp.DECODE_LARGE = defaults


def _report(label: str, nbytes: int, cublas: float, rows: list, results: dict, key: str) -> None:
    """Print cuBLAS against the best of the sorted (ms, config) rows, and keep them all."""
    best = rows[0]
    print(
        f"{label}: cuBLAS {cublas * 1e3:6.1f} us ({nbytes / cublas / 1e6:5.0f} GB/s); "
        f"best {best[0] * 1e3:6.1f} us ({nbytes / best[0] / 1e6:5.0f} GB/s) at {best[1]}; "
        f"next {[(round(r[0] * 1e3, 1), r[1]) for r in rows[1:3]]}",
        flush=True,
    )
    results[key] = {"cublas_us": cublas * 1e3, "rows": [(r[0] * 1e3, r[1]) for r in rows]}


def sweep_gemv(results: dict) -> None:
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
              "down": (4096, 14336), "lm_head": (128256, 4096)}  # fmt: skip
    configs = list(itertools.product((8, 16, 32), (256, 512, 1024), (4, 8), (3, 5)))
    totals: dict[tuple, float] = {}
    for name, (n, k) in shapes.items():
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        ref = torch.nn.functional.linear(x, w)
        cublas = graph_ms(partial(torch.nn.functional.linear, x, w))
        rows = []
        for cfg in configs:
            gv.BLOCK_N, gv.BLOCK_K, gv.NUM_WARPS, gv.NUM_STAGES = cfg
            try:
                out = gv.gemv(x, w)
                if not torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2):
                    print(f"  gemv {name} {cfg}: WRONG", flush=True)
                    continue
                ms = graph_ms(partial(gv.gemv, x, w))
            except Exception as e:
                print(f"  gemv {name} {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append((ms, cfg))
            totals[cfg] = totals.get(cfg, 0.0) + ms * (32 if name != "lm_head" else 1)
        rows.sort()
        _report(f"gemv {name:8s} [{n}x{k}]", n * k * 2, cublas, rows, results, f"gemv_{name}")
    best_all = min(totals.items(), key=lambda kv: kv[1])
    print(f"gemv: best single config over a layer stack: {best_all[0]} "
          f"({best_all[1]:.3f} ms for 32 layers + lm_head)", flush=True)  # fmt: skip


# The decoder's projections (the LM head's cuBLAS kernel already reads at ~4,230 GB/s).
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}  # fmt: skip


def sweep_skinny(results: dict) -> None:
    configs = list(itertools.product((16, 32, 64, 128), (128, 256), (4,), (3, 4, 5)))
    configs += [(64, 128, 8, 4), (128, 128, 8, 4), (32, 512, 4, 3), (16, 512, 4, 3)]
    for m in (1, 64):
        per_layer = {"cublas": 0.0, "best": 0.0}
        for name, (n, k) in SHAPES.items():
            nbytes = n * k * 2
            copies = max(1, -(-200_000_000 // nbytes))  # > 4x the 50 MB L2
            torch.manual_seed(0)
            ws = [
                torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)
            ]
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ref = torch.nn.functional.linear(x, ws[0]).float()

            def run(fn, ws=ws):
                return graph_ms(lambda: [fn(w) for w in ws], rep=15) / len(ws)

            cublas = run(partial(torch.nn.functional.linear, x))
            rows = []
            for cfg in configs:
                try:
                    out = sg.skinny_gemm(x, ws[0], cfg).float()
                    if not torch.allclose(out, ref, atol=2e-2, rtol=2e-2):
                        print(f"  skinny m{m} {name} {cfg}: WRONG", flush=True)
                        continue
                    rows.append((run(lambda w, c=cfg, x=x: sg.skinny_gemm(x, w, c)), cfg))
                except Exception as e:  # out of shared memory etc.
                    print(f"  skinny m{m} {name} {cfg}: {type(e).__name__}", flush=True)
            rows.sort()
            per_layer["cublas"] += cublas * 32
            per_layer["best"] += rows[0][0] * 32
            _report(
                f"skinny M={m:2d} {name:8s} [{n}x{k}]", nbytes, cublas, rows, results,
                f"skinny_m{m}_{name}",
            )  # fmt: skip
        print(
            f"skinny M={m}: 32 layers, cuBLAS {per_layer['cublas']:.3f} ms, "
            f"best configs {per_layer['best']:.3f} ms",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=("attention", "gemv", "skinny"), default=None)
    args = ap.parse_args()
    results: dict = {}
    if args.only in (None, "gemv"):
        sweep_gemv(results)
    if args.only in (None, "attention"):
        sweep_attention(results)
    if args.only in (None, "skinny"):
        sweep_skinny(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
