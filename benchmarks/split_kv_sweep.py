"""Sweep the long-context attention paths on the GPU (one layer, Llama-3.1-8B's heads).

    python benchmarks/split_kv_sweep.py [--json PATH] [--quick]

1. Decode steps of few long sequences, as a CUDA graph replays them: kernel B alone (no
   split) against split-KV (kernel C + reduce) at each partition count and launch setting.
   GB/s counts the context's K and V once; the rule in triton_split_kv.split_kv_parts and
   the constants SPLIT_BLOCK_N / SPLIT_NUM_STAGES come from here.
2. One long prefill (8,000 tokens, causal) through kernel B at each prefill tile:
   TFLOP/s counts 4 * heads * head_dim * (visible keys summed over queries).
Times are CUDA-graph replays (GPU time alone), median of triton.testing.do_bench_cudagraph.
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
from attention_kernels import make_step  # noqa: E402

import cadence.attention.triton_paged as tp  # noqa: E402
import cadence.attention.triton_split_kv as sk  # noqa: E402

ARGS = SimpleNamespace(block_size=16, kv_heads=8, heads=32, head_dim=128, dtype="bfloat16")
SCALE = 128**-0.5


def graph_us(fn, rep: int = 40) -> float:
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep) * 1e3


def sweep_split(results: dict, quick: bool) -> None:
    cases = [(1, 1024), (1, 2048), (1, 8000), (1, 32000), (2, 8000), (4, 4000), (8, 4000)]
    cases += [(16, 2000), (8, 1024)]
    settings = list(itertools.product((32, 64, 128), (2, 3))) if not quick else [(64, 2)]
    for b, ctx in cases:
        torch.manual_seed(0)
        q, k, v, cache, meta = make_step([1] * b, [ctx] * b, ARGS)
        kv_bytes = b * ctx * 8 * 128 * 2 * 2
        plain = tp.TritonAttentionBackend(num_kv_heads=8, split_kv=False)
        m = plain.build(meta())
        base = graph_us(partial(plain.forward, q, k, v, cache, m, SCALE))
        rows = []
        defaults = sk.SPLIT_BLOCK_N, sk.SPLIT_NUM_STAGES
        split = tp.TritonAttentionBackend(num_kv_heads=8, split_kv=True)
        for parts in (2, 4, 8, 16, 32, 64):
            if b * 8 * parts > 8 * 132:
                continue
            for bn, stages in settings:
                sk.SPLIT_BLOCK_N, sk.SPLIT_NUM_STAGES = bn, stages
                m = split.build(meta())
                m.backend_data.num_parts = parts
                try:
                    us = graph_us(partial(split.forward, q, k, v, cache, m, SCALE))
                except Exception as e:  # out of shared memory etc.
                    print(f"  b{b} ctx{ctx} parts {parts} {bn}/{stages}: {type(e).__name__}")
                    continue
                rows.append((us, parts, bn, stages))
        sk.SPLIT_BLOCK_N, sk.SPLIT_NUM_STAGES = defaults
        rows.sort()
        rule = sk.split_kv_parts(b, 8, 132)
        at_rule = [r for r in rows if r[1] == rule and r[2:] == defaults]
        best = rows[0]
        print(
            f"split b={b:2d} ctx={ctx:5d}: no split {base:7.1f} us ({kv_bytes / base / 1e3:5.0f} GB/s)"
            f"; best {best[0]:6.1f} us ({kv_bytes / best[0] / 1e3:5.0f} GB/s) at parts {best[1]}, "
            f"BLOCK_N {best[2]}, stages {best[3]}; rule (parts {rule}, {defaults}): "
            f"{at_rule[0][0] if at_rule else float('nan'):6.1f} us; next "
            f"{[(round(r[0], 1), *r[1:]) for r in rows[1:4]]}",
            flush=True,
        )
        results[f"split_b{b}_ctx{ctx}"] = {"no_split_us": base, "rows": rows}


def sweep_prefill(results: dict, quick: bool, length: int = 8000, prompts: int = 1) -> None:
    """`prompts` causal prompts of `length` tokens in one step (ARGS' heads)."""
    torch.manual_seed(0)
    step = make_step([length] * prompts, [length] * prompts, ARGS)
    q, k, v, cache, meta = step
    flops = 4 * ARGS.heads * ARGS.head_dim * length * (length + 1) / 2 * prompts
    backend = tp.TritonAttentionBackend(num_kv_heads=ARGS.kv_heads)
    defaults = (tp.MAX_BLOCK_M, tp.BLOCK_N, tp.PREFILL_NUM_WARPS, tp.PREFILL_NUM_STAGES)
    two_phase = tp.PREFILL_TWO_PHASE
    configs = list(itertools.product((64, 128), (64, 128), (4, 8), (2, 3), (True,)))
    if quick:  # the current tile, with and without the unmasked first phase
        configs = [(*defaults, True), (*defaults, False), (128, 128, 8, 3, True)]
    rows = []
    for bm, bn, warps, stages, phases in configs:
        tp.MAX_BLOCK_M, tp.BLOCK_N, tp.PREFILL_NUM_WARPS, tp.PREFILL_NUM_STAGES = (
            bm,
            bn,
            warps,
            stages,
        )
        tp.PREFILL_TWO_PHASE = phases
        m = backend.build(meta())
        try:
            us = graph_us(partial(backend.forward, q, k, v, cache, m, SCALE), rep=100)
        except Exception as e:
            print(f"  prefill {bm}x{bn} w{warps} s{stages}: {type(e).__name__}")
            continue
        rows.append((us, bm, bn, warps, stages, phases))
        print(f"  prefill {prompts}x{length}: {bm}x{bn} w{warps} s{stages} two-phase {phases}: {us:8.1f} us "
              f"{flops / us / 1e6:6.1f} TFLOP/s", flush=True)  # fmt: skip
    tp.MAX_BLOCK_M, tp.BLOCK_N, tp.PREFILL_NUM_WARPS, tp.PREFILL_NUM_STAGES = defaults
    tp.PREFILL_TWO_PHASE = two_phase
    rows.sort()
    best = rows[0]
    print(f"prefill {prompts} x {length} tokens, {ARGS.heads}/{ARGS.kv_heads} heads, one layer: "
          f"best {best[0]:.0f} us = {flops / best[0] / 1e6:.0f} TFLOP/s at {best[1:]}",
          flush=True)  # fmt: skip
    results[f"prefill_{prompts}x{length}_g{ARGS.heads // ARGS.kv_heads}"] = {
        "flops": flops,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="the current settings alone")
    ap.add_argument("--part", choices=["split", "prefill", "all"], default="all")
    ap.add_argument(
        "--kv-heads", type=int, default=ARGS.kv_heads, help="prefill: 4 for Qwen3-30B-A3B"
    )
    ap.add_argument("--prompts", type=int, default=1, help="prefill: prompts in the step")
    ap.add_argument("--length", type=int, default=8000, help="prefill: tokens a prompt")
    args = ap.parse_args()
    results: dict = {}
    if args.part in ("split", "all"):
        sweep_split(results, args.quick)
    if args.part in ("prefill", "all"):
        ARGS.kv_heads = args.kv_heads
        sweep_prefill(results, args.quick, args.length, args.prompts)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
