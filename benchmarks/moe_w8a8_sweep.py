"""Decide, per FP8 expert shape and step size, whether a step's experts take the swapped W8A8
grouped GEMMs (cadence/ops/moe_w8a8.py) or the W8A16 ones (fused_moe.py), and write the
winning W8A8 tiles into the tile table's entries as "w8a8".

    python benchmarks/moe_w8a8_sweep.py --table cadence/ops/moe_tiles_h200.json \
        [--out OUT.json] [--models benchmarks/qwen3-30b-a3b ...] [--batches 8 ... 256] [--jobs 14]

Steps whose entry sends them to the per-pair GEMVs ("pairs") or to torch's grouped GEMM
("grouped_mm") are left alone. For the others, each W8A8 GEMM (gated, down) is timed for
every tile of each row block the step's size suggests, on a random routing; then the whole
layer (sorting, quantizing the tokens and the activation, both GEMMs, the slot sum) both
ways, each replayed in a CUDA graph: W8A16 with the entry's own tiles, W8A8 with the best
tiles. The tiles go in where W8A8 is faster by more than MARGIN, and come out where not.
Each line gives both layers' microseconds, the bandwidth at which they read the chosen
experts' weights, and how far apart their outputs are (W8A8 also rounds the tokens and the
activation to e4m3). Triton compiles every tile first, in --jobs processes.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch
from moe_grouped_mm_sweep import timed
from moe_pairs_sweep import by_batch, entry_for, keep_entry
from moe_tile_sweep import Case, block_ms, expert_shape, format_table, table_sweep_args, time_us
from triton.runtime.errors import OutOfResources

MARGIN = 0.03
BATCHES = [8, 16, 32, 64, 128, 256]


def w8a8_tiles() -> list[dict]:
    """The candidates for any row block: 64 or 128 weight columns a program (the MMA's M
    side), K runs of 128 or 256 e4m3 bytes, pipelines 3-5 deep."""
    out = []
    for block_n in (64, 128):
        for block_k in (128, 256):
            for warps in (4, 8) if block_n == 128 else (4,):
                for stages in (3, 4, 5):
                    out.append(
                        dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
                    )
    return out


class W8A8Case:
    """A Case's FP8 experts and routing with the W8A8 operands: the tokens and an activation
    quantized per row, rows aligned per row block."""

    def __init__(self, case: Case) -> None:
        from cadence.ops import fp8_rows

        self.case = case
        self.xq, self.x_scale = fp8_rows.quantize_rows(case.x)
        self.aligned: dict[int, tuple] = {}

    def gemm(self, kind: str, block_m: int, tile: dict):
        """A thunk that runs one W8A8 GEMM with this tile."""
        from cadence.ops import fp8_rows, moe_routing, moe_w8a8

        c = self.case
        if block_m not in self.aligned:
            sp, be = moe_routing.align(c.ids, c.w13.shape[0], block_m)
            act = torch.randn(sp.numel(), c.inter, device="cuda", dtype=torch.bfloat16)
            act_q, act_scale = fp8_rows.quantize_rows(act)
            out13 = torch.empty_like(act)
            out2 = torch.empty(c.tokens * c.top_k, c.hidden, device="cuda", dtype=act.dtype)
            self.aligned[block_m] = (sp, be, act_q, act_scale, out13, out2)
        sp, be, act_q, act_scale, out13, out2 = self.aligned[block_m]
        common = (sp, be, c.weights.flatten(), c.tokens * c.top_k, c.top_k)
        full = dict(BLOCK_M=block_m, **tile)
        if kind == "gated":
            args = (self.xq, self.x_scale, c.w13, c.s13, out13, *common, full)
        else:
            args = (act_q, act_scale, c.w2, c.s2, out2, *common, full)
        return lambda: moe_w8a8.launch(*args, gated=kind == "gated")


_CASES: dict[tuple, W8A8Case] = {}


def _compile(job: tuple) -> None:
    """Run one kernel once in a worker process: Triton compiles it into its disk cache."""
    shape, kind, block_m, tile = job
    if shape not in _CASES:  # (one case a worker: quantizing the experts takes a while)
        _CASES[shape] = W8A8Case(Case(shape, True, 256))
    case = _CASES[shape]
    with contextlib.suppress(OutOfResources):  # (too much shared memory: never a pick)
        case.gemm(kind, block_m, tile)()
    torch.cuda.synchronize()


def best_tiles(case: W8A8Case, tokens: int, shape: tuple) -> tuple[float, dict]:
    """(us of both GEMMs, the "w8a8" tiles) for the fastest row block and tiles."""
    experts, _, _, top_k = shape
    best = None
    for block_m in block_ms(tokens, top_k, experts):
        picks = {}
        for kind in ("gated", "down"):
            timed_tiles = [(time_us(case.gemm(kind, block_m, t)), t) for t in w8a8_tiles()]
            picks[kind] = min(timed_tiles, key=lambda p: p[0])
        total = picks["gated"][0] + picks["down"][0]
        if best is None or total < best[0]:
            best = (total, dict(BLOCK_M=block_m, gated=picks["gated"][1], down=picks["down"][1]))
    return best


def layer_us(case: Case, entry: dict) -> tuple[float, str, torch.Tensor]:
    """(us, how timed, the output) of fused_experts on the case with this tile entry."""
    from cadence.ops import fused_moe, moe_tiles

    args = (case.x, case.w13, case.w2, case.ids, case.weights, case.s13, case.s2)
    real_config = moe_tiles.config
    moe_tiles.config = lambda *a: entry
    try:
        us, how = timed([lambda: fused_moe.fused_experts(*args)] * 4)
        return us, how, fused_moe.fused_experts(*args)
    finally:
        moe_tiles.config = real_config


def sweep_shape(entries: dict, shape: tuple, batches: list[int], key: str) -> dict:
    for tokens in batches:
        entry = entry_for(entries, tokens)
        if "pairs" in entry or entry.get("grouped_mm"):  # (such steps take other paths)
            continue
        entry.pop("w8a8", None)
        case = Case(shape, True, tokens)
        both_us, tiles = best_tiles(W8A8Case(case), tokens, shape)
        w8a16_us, how_a, want = layer_us(case, entry)
        w8a8_us, how_b, got = layer_us(case, {**entry, "w8a8": tiles})
        diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        won = w8a8_us < w8a16_us * (1 - MARGIN)
        if won:
            entry["w8a8"] = tiles
        keep_entry(entries, tokens, entry, won)
        gbps = case.weight_bytes_read() / 1e3  # (bytes / us / 1e3 = GB/s)
        print(
            f"{key} T={tokens}: W8A16 {w8a16_us:.1f} us ({gbps / w8a16_us:.0f} GB/s, {how_a}), "
            f"W8A8 {w8a8_us:.1f} us ({gbps / w8a8_us:.0f} GB/s, {how_b}; its GEMMs alone "
            f"{both_us:.1f} us) -> {w8a16_us / w8a8_us:.2f}x, {'w8a8' if won else 'w8a16'} "
            f"{json.dumps(tiles)}; max diff {diff:.1e} of max |out|",
            flush=True,
        )
        del case
    return by_batch(entries)


def main() -> None:
    models = ["benchmarks/qwen3-30b-a3b", "benchmarks/mixtral-8x7b"]
    ap = table_sweep_args(__doc__.split("\n")[0], models, BATCHES)
    ap.add_argument("--jobs", type=int, default=14)
    args = ap.parse_args()
    from cadence.ops import moe_tiles

    out = Path(args.out or args.table)
    table = json.loads(Path(args.table).read_text())
    shapes = [expert_shape(m) for m in args.models]
    t0 = time.time()
    smallest = min(shapes, key=lambda s: s[0] * s[1] * s[2])
    jobs = [
        (smallest, kind, block_m, tile)
        for block_m in (16, 32, 64)
        for tile in w8a8_tiles()
        for kind in ("gated", "down")
    ]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        pool.map(_compile, jobs, chunksize=2)
    print(f"compiled {len(jobs)} kernels in {time.time() - t0:.0f} s", flush=True)
    for shape in shapes:
        key = moe_tiles.shape_key(torch.float8_e4m3fn, *shape[:3])
        if key not in table["shapes"]:
            print(f"{key}: not in the table (run moe_tile_sweep.py first)", flush=True)
            continue
        table["shapes"][key] = sweep_shape(table["shapes"][key], shape, args.batches, key)
        out.write_text(format_table(table))  # (a cut-short sweep keeps its part)
    print(f"wrote {out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
