"""Decide, per expert shape and large step size, the order the grouped GEMMs' programs run
in (a tile's GROUP_M, cadence/ops/fused_moe.py's _program_tile), and write it into the tile
table cadence/ops/moe_tiles.py reads.

    python benchmarks/moe_group_sweep.py --table cadence/ops/moe_tiles_h200.json \
        [--out OUT.json] [--models benchmarks/qwen3-30b-a3b ...] [--batches 256 ... 8192]

Why: by default a GEMM's programs walk every row block of one column tile before the next
tile, so each column tile reads all of A again. In a prefill step A is far larger than L2
(Mixtral-8x7B at 8,192 tokens: the gathered x rows 134 MB for each of the gated GEMM's 112
column tiles; Qwen3-30B-A3B's down GEMM: 100 MB of activations for each of 16), and those
re-reads come from HBM. Walking GROUP_M row blocks across every column tile first keeps
those rows, and the few experts they belong to, in L2.

For each shape, dtype (bf16, fp8) and T: the entry a step of T takes (moe_tiles.config's
rule), each GEMM with its entry's tile timed in the default order and with each GROUP_M;
a GROUP_M faster than the default order by more than MARGIN goes into that tile (and one
that is not comes out). Sizes the table has no entry for (8,192, the GPU's default step)
get the entry they take now, as their own, only where a GROUP_M wins. Timed eagerly, back
to back: these GEMMs take 0.1-10 ms, so launches do not count; nothing new compiles
(GROUP_M is a run-time argument). Each step size also reports the alignment's two paths
(one program, or three launches past moe_routing.PARALLEL_PAIRS), timed in CUDA graphs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from moe_pairs_sweep import by_batch, entry_for, graph_us, keep_entry
from moe_tile_sweep import BATCHES, Case, expert_shape, format_table, table_sweep_args, time_us

GROUPS = (1, 2, 4, 8, 16, 32, 64)
MARGIN = 0.03


def best_group(case: Case, block_m: int, kind: str, tile: dict) -> tuple[float, float, int]:
    """(default order us, best GROUP_M's us, that GROUP_M) for one GEMM's tile."""
    base_tile = {k: v for k, v in tile.items() if k != "GROUP_M"}
    base = time_us(case.gemm(kind, block_m, base_tile))
    timed = [(time_us(case.gemm(kind, block_m, dict(base_tile, GROUP_M=g))), g) for g in GROUPS]
    best_us, group = min(timed)
    return base, best_us, group


def time_align(case: Case, block_m: int) -> str:
    """The alignment's two paths at this step (moe_routing.PARALLEL_PAIRS picks one), each
    timed in a CUDA graph of six calls: launches cost what they cost in a graph."""
    from cadence.ops import moe_routing

    experts = case.w13.shape[0]
    one, three = (
        graph_us([lambda p=p: moe_routing.align(case.ids, experts, block_m, parallel=p)] * 6)
        for p in (False, True)
    )
    return f"align one program {one:.1f} us, three launches {three:.1f} us"


def sweep_shape(entries: dict, shape: tuple, fp8: bool, batches: list[int], key: str) -> dict:
    """`entries` (one shape's, from the table) with GROUP_M decided at each of `batches`."""
    for tokens in batches:
        entry = entry_for(entries, tokens)
        if "pairs" in entry:  # (such steps take the per-pair GEMVs, not these GEMMs)
            continue
        case = Case(shape, fp8, tokens)
        print(f"{key} T={tokens}: {time_align(case, entry['BLOCK_M'])}", flush=True)
        won = False
        for kind in ("gated", "down"):
            tile = dict(entry[kind])
            base, best_us, group = best_group(case, entry["BLOCK_M"], kind, tile)
            tile.pop("GROUP_M", None)
            if best_us < base * (1 - MARGIN):
                tile["GROUP_M"] = group
                won = True
            entry[kind] = tile
            print(
                f"{key} T={tokens} {kind}: default order {base:.1f} us, GROUP_M={group} "
                f"{best_us:.1f} us ({base / best_us:.2f}x) -> {tile.get('GROUP_M', 'default')}",
                flush=True,
            )
        keep_entry(entries, tokens, entry, won)
        del case
    return by_batch(entries)


def main() -> None:
    models = ["benchmarks/qwen3-30b-a3b", "benchmarks/mixtral-8x7b"]
    batches = [b for b in BATCHES if b >= 256] + [8192]
    args = table_sweep_args(__doc__.split("\n")[0], models, batches).parse_args()
    from cadence.ops import moe_tiles

    out = Path(args.out or args.table)
    table = json.loads(Path(args.table).read_text())
    t0 = time.time()
    for model in args.models:
        shape = expert_shape(model)
        for fp8 in (False, True):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            key = moe_tiles.shape_key(dtype, *shape[:3])
            if key not in table["shapes"]:
                print(f"{key}: not in the table (run moe_tile_sweep.py first)", flush=True)
                continue
            table["shapes"][key] = sweep_shape(table["shapes"][key], shape, fp8, args.batches, key)
            out.write_text(format_table(table))  # (a cut-short sweep keeps its part)
    print(f"wrote {out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
