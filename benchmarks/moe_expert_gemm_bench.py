"""How fast a large step's expert GEMMs can go in 16 bits: torch's grouped GEMM (CUTLASS,
what cadence/ops/moe_grouped_mm.py runs) against one cuBLAS GEMM per expert (the group
sizes read on the host: a sync a layer, so only prefill steps outside CUDA graphs could
take it), and the whole layer in equal chunks of tokens (moe_grouped_mm.CHUNK_BYTES)
against one piece.

    python benchmarks/moe_expert_gemm_bench.py [--models benchmarks/mixtral-8x7b ...]
        [--tokens 2048 4096 8192]

Each line: us a call (moe_tile_sweep.time_us: CUDA events over 10 calls after a warm-up)
and TFLOP/s (2 x rows x N x K per GEMM). The routing is uniform random, top-k of the model.
"""

from __future__ import annotations

import argparse

import torch
from moe_tile_sweep import expert_shape, time_us


def per_expert_mm(a: torch.Tensor, w: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """a [P, K] sorted by expert, w [E, N, K]: one cuBLAS GEMM per expert's rows."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=a.dtype, device=a.device)
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            torch.mm(a[start:end], w[e].t(), out=out[start:end])
        start = end
    return out


def bench_shape(model: str, tokens: int) -> None:
    from cadence.ops import fused, moe_grouped_mm

    experts, hidden, inter, top_k = expert_shape(model)
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dt, generator=g) * 0.02
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=dt, generator=g) * 0.02
    x = torch.randn(tokens, hidden, device=dev, dtype=dt, generator=g)
    weights, ids = torch.rand(tokens, experts, device=dev, generator=g).topk(top_k, dim=1)
    rows, offsets, row_of = moe_grouped_mm.sort_rows(ids, experts)
    ends = offsets.tolist()
    xs = x.index_select(0, rows)
    pairs = tokens * top_k
    name = model.rstrip("/").split("/")[-1]

    def line(what: str, us: float, flops: float) -> None:
        print(f"{name} T={tokens} {what}: {us:.1f} us, {flops / us / 1e6:.0f} TFLOP/s", flush=True)

    up_flops = 2 * pairs * 2 * inter * hidden
    line(
        "gate-up grouped_mm",
        time_us(lambda: torch._grouped_mm(xs, w13.transpose(1, 2), offs=offsets)),
        up_flops,
    )
    line("gate-up per-expert mm", time_us(lambda: per_expert_mm(xs, w13, ends)), up_flops)
    act = fused.silu_and_mul(torch._grouped_mm(xs, w13.transpose(1, 2), offs=offsets))
    down_flops = 2 * pairs * inter * hidden
    line(
        "down grouped_mm",
        time_us(lambda a=act: torch._grouped_mm(a, w2.transpose(1, 2), offs=offsets)),
        down_flops,
    )
    line("down per-expert mm", time_us(lambda a=act: per_expert_mm(a, w2, ends)), down_flops)
    del act
    layer_flops = up_flops + down_flops
    line(
        "layer, chunked as served",
        time_us(lambda: moe_grouped_mm.grouped_mm_experts(x, w13, w2, ids, weights)),
        layer_flops,
    )
    real = moe_grouped_mm.CHUNK_BYTES
    moe_grouped_mm.CHUNK_BYTES = 1 << 40
    try:
        line(
            "layer, one piece",
            time_us(lambda: moe_grouped_mm.grouped_mm_experts(x, w13, w2, ids, weights)),
            layer_flops,
        )
    finally:
        moe_grouped_mm.CHUNK_BYTES = real

    def layer_per_expert() -> torch.Tensor:
        r, offs, r_of = moe_grouped_mm.sort_rows(ids, experts)
        e_ends = offs.tolist()  # (the host sync this path needs)
        h = per_expert_mm(x.index_select(0, r), w13, e_ends)
        a = fused.silu_and_mul(h)
        del h
        o = per_expert_mm(a, w2, e_ends)
        return moe_grouped_mm.combine(o, r_of, weights, torch.empty_like(x))

    line("layer, per-expert mm + host sync", time_us(layer_per_expert), layer_flops)
    want = moe_grouped_mm.grouped_mm_experts(x, w13, w2, ids, weights).float()
    diff = ((layer_per_expert().float() - want).abs().max() / want.abs().max()).item()
    print(
        f"{name} T={tokens}: per-expert layer vs served: max diff {diff:.1e} of max |out|",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--models", nargs="+", default=["benchmarks/mixtral-8x7b", "benchmarks/qwen3-30b-a3b"]
    )
    p.add_argument("--tokens", nargs="+", type=int, default=[2048, 4096, 8192])
    args = p.parse_args()
    for model in args.models:
        for tokens in args.tokens:
            bench_shape(model, tokens)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
