"""Decode attention over an FP8 (e4m3) KV cache against bf16, by kernel tile (CUDA).

    python benchmarks/fp8_kv_sweep.py [--json PATH]

Llama-3.1-8B's attention (32 query heads, 8 KV heads, head_dim 128), one layer, replayed in
a CUDA graph: a batch of 8 decodes at 4,000 tokens of context (kernel B's decode tile) and
one decode at 32,000 (split-KV, kernel C). Each tile setting is timed on both caches; an FP8
tile holds the same keys in half the bytes, so its best BLOCK_N may be larger.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import torch
from attention_kernels import make_step

from cadence.attention import triton_paged, triton_split_kv
from cadence.attention.triton_paged import TritonAttentionBackend

DECODE = [(128, 4, 2), (128, 4, 3), (256, 4, 2), (256, 8, 2), (64, 4, 3), (128, 8, 3)]
SPLIT = [(128, 4, 2), (128, 4, 3), (256, 4, 2), (256, 8, 2), (64, 4, 3)]


def graph_ms(backend, step, kv_scale) -> float:
    from triton.testing import do_bench_cudagraph

    q, k, v, cache, meta = step
    m = backend.build(meta())

    def fn():
        return backend.forward(q, k, v, cache, m, 128**-0.5, None, kv_scale)

    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shape = SimpleNamespace(heads=32, kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16")
    results = []
    for case, qlens, slens, configs in [
        ("8x4000", [1] * 8, [4000] * 8, DECODE),
        ("1x32000", [1], [32000], SPLIT),
    ]:
        step = make_step(qlens, slens, shape)
        q, k, v, cache, meta = step
        fp8_step = (q, k, v, (cache / 4).to(torch.float8_e4m3fn), meta)
        for cfg in configs:
            if case == "8x4000":
                triton_paged.DECODE_SMALL = cfg
                backend = TritonAttentionBackend(num_kv_heads=8, split_kv=False)
            else:
                triton_split_kv.SPLIT_BLOCK_N, warps, stages = cfg
                triton_split_kv.SPLIT_NUM_WARPS, triton_split_kv.SPLIT_NUM_STAGES = warps, stages
                backend = TritonAttentionBackend(num_kv_heads=8, split_kv=True)
            row = {"case": case, "config": list(cfg)}
            for name, st, scale in [("bf16", step, (1.0, 1.0)), ("fp8", fp8_step, (4.0, 4.0))]:
                try:
                    row[f"{name}_ms"] = graph_ms(backend, st, scale)
                except Exception as e:  # noqa: BLE001 (a tile that does not fit)
                    row[f"{name}_ms"] = float("inf")
                    print(f"  {case} {cfg} {name}: {type(e).__name__}", flush=True)
            kv_bytes = sum(slens) * 8 * 128 * 2
            row["bf16_gbps"] = 2 * kv_bytes / row["bf16_ms"] / 1e6
            row["fp8_gbps"] = kv_bytes / row["fp8_ms"] / 1e6
            results.append(row)
            print(f"{case:8s} {str(cfg):14s} bf16 {row['bf16_ms'] * 1e3:7.1f} us "
                  f"({row['bf16_gbps']:5.0f} GB/s)  fp8 {row['fp8_ms'] * 1e3:7.1f} us "
                  f"({row['fp8_gbps']:5.0f} GB/s)", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
