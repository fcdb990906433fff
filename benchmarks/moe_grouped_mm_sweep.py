"""Decide, per expert shape and step size (64 tokens and up), whether a step's experts take
torch's grouped GEMM (cadence/ops/moe_grouped_mm.py: bf16, or FP8 experts through the W8A8
scaled GEMM) or the Triton grouped GEMMs (fused_moe.py: FP8 experts W8A16), and write
"grouped_mm": true into the tile table's entries where it wins.

    python benchmarks/moe_grouped_mm_sweep.py --table cadence/ops/moe_tiles_h200.json \
        [--out OUT.json] [--models benchmarks/qwen3-30b-a3b ...] [--batches 256 ... 8192] \
        [--dtypes bf16 fp8]

Both paths are timed whole (sorting the pairs, both GEMMs, the activation, the weighted
sum over slots) on the same random routing, each replayed in a CUDA graph (which also
shows torch's grouped GEMM captures); the Triton path with the entry's own tiles. The
flag goes in where torch's path is faster by more than MARGIN and its graph, replayed
after the routing changed, gives the eager result; it comes out where not. Each line also gives both paths' TFLOP/s (2 x pairs x 3 x hidden x intermediate
FLOPs a step) and how far apart their outputs are (they round differently: module
docstring of moe_grouped_mm.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from moe_pairs_sweep import by_batch, entry_for, graph_us, keep_entry
from moe_tile_sweep import Case, expert_shape, format_table, table_sweep_args, time_us

MARGIN = 0.03
BATCHES = [64, 128, 256, 512, 1024, 2048, 4096, 8192]


def timed(calls: list) -> tuple[float, str]:
    """(us a call, how it was timed): in a CUDA graph, or eagerly if capture fails."""
    try:
        return graph_us(calls), "graph"
    except RuntimeError as e:  # (a capture torch refuses: eager, and say so)
        print(f"   capture failed ({str(e).splitlines()[0][:120]}): timed eagerly", flush=True)
        torch.cuda.synchronize()
        return time_us(calls[0]), "eager"


def replays_new_routing(x, w13, w2, ids, weights, s13=None, s2=None) -> bool:
    """Whether torch's path, captured in a CUDA graph, gives the eager result when replayed
    after the routing changed (decode and mixed-step graphs replay with new ids each step,
    so the group sizes must be read on the device, not fixed at capture)."""
    from cadence.ops import moe_grouped_mm

    static_ids, static_w = ids.clone(), weights.clone()

    def run():
        return moe_grouped_mm.grouped_mm_experts(
            x, w13, w2, static_ids, static_w, w13_scale=s13, w2_scale=s2
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    experts, top_k = w13.shape[0], ids.shape[1]
    g = torch.Generator(device="cuda").manual_seed(1)
    scores = torch.rand(ids.shape[0], experts, device="cuda", generator=g)
    scores[:, : experts // 2] *= 0.5  # (skewed: group sizes unlike the captured ones)
    new_w, new_ids = scores.topk(top_k, dim=1)
    static_ids.copy_(new_ids)
    static_w.copy_(new_w.to(static_w.dtype))
    graph.replay()
    want = run()
    torch.cuda.synchronize()
    return torch.allclose(out.float(), want.float(), atol=1e-3, rtol=1e-2)


def sweep_shape(entries: dict, shape: tuple, batches: list[int], key: str, fp8: bool) -> dict:
    from cadence.ops import fused_moe, moe_grouped_mm, moe_tiles

    _, hidden, inter, top_k = shape
    for tokens in batches:
        entry = entry_for(entries, tokens)
        if "pairs" in entry:  # (such steps take the per-pair GEMVs)
            continue
        entry.pop("grouped_mm", None)
        case = Case(shape, fp8, tokens)
        args = (case.x, case.w13, case.w2, case.ids, case.weights)
        if not moe_grouped_mm.usable(case.x, case.w13, case.s13, None, None):
            print(f"{key}: torch's grouped GEMM cannot take these experts", flush=True)
            return entries
        real_config = moe_tiles.config
        moe_tiles.config = lambda *a, e=entry: e
        try:
            triton_args = (*args, case.s13, case.s2)
            triton_us, how_t = timed([lambda a=triton_args: fused_moe.fused_experts(*a)] * 4)
            want = fused_moe.fused_experts(*triton_args)
        finally:
            moe_tiles.config = real_config
        scales = dict(w13_scale=case.s13, w2_scale=case.s2)
        torch_us, how_g = timed(
            [lambda a=args, s=scales: moe_grouped_mm.grouped_mm_experts(*a, **s)] * 4
        )
        got = moe_grouped_mm.grouped_mm_experts(*args, **scales)
        diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        flops = 2 * tokens * top_k * 3 * hidden * inter
        replays = how_g == "graph" and replays_new_routing(*args, case.s13, case.s2)
        won = replays and torch_us < triton_us * (1 - MARGIN)
        if won:
            entry["grouped_mm"] = True
        keep_entry(entries, tokens, entry, won)
        print(
            f"{key} T={tokens}: triton {triton_us:.1f} us ({flops / triton_us / 1e6:.0f} "
            f"TFLOP/s, {how_t}), torch grouped_mm {torch_us:.1f} us ({flops / torch_us / 1e6:.0f}"
            f" TFLOP/s, {how_g}) -> {triton_us / torch_us:.2f}x, "
            f"{'grouped_mm' if won else 'triton'}; max diff {diff:.1e} of max |out|; graph "
            f"replayed with a new routing: {'equal' if replays else 'NOT EQUAL or not captured'}",
            flush=True,
        )
        del case
    return by_batch(entries)


def main() -> None:
    # (a shape the table lacks keeps the default tiles at every size: skipped)
    models = ["benchmarks/qwen3-30b-a3b", "benchmarks/mixtral-8x7b"]
    ap = table_sweep_args(__doc__.split("\n")[0], models, BATCHES)
    ap.add_argument("--dtypes", nargs="+", choices=["bf16", "fp8"], default=["bf16"])
    args = ap.parse_args()
    from cadence.ops import moe_tiles

    out = Path(args.out or args.table)
    table = json.loads(Path(args.table).read_text())
    t0 = time.time()
    for model in args.models:
        shape = expert_shape(model)
        for dtype in args.dtypes:
            fp8 = dtype == "fp8"
            weight_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            key = moe_tiles.shape_key(weight_dtype, *shape[:3])
            if key not in table["shapes"]:
                print(f"{key}: not in the table (run moe_tile_sweep.py first)", flush=True)
                continue
            entries = table["shapes"][key]
            table["shapes"][key] = sweep_shape(entries, shape, args.batches, key, fp8)
            out.write_text(format_table(table))  # (a cut-short sweep keeps its part)
    print(f"wrote {out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
