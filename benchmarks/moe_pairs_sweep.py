"""Decide, per expert shape and small step size, between the grouped GEMMs
(cadence/ops/fused_moe.py: align, gated, down, slot sum) and the per-pair GEMVs
(cadence/ops/moe_pairs.py: gated, down with the slot sum), and write the choice into the
tile table cadence/ops/moe_tiles.py reads.

    python benchmarks/moe_pairs_sweep.py --table cadence/ops/moe_tiles_h200.json \
        [--models benchmarks/qwen3-30b-a3b ...] [--batches 1 2 4 8 16 32] [--jobs 14]

Everything is timed inside CUDA graphs (as decode steps run): at these sizes a kernel
takes 5-20 us, and eager launches back to back would time the launch rate. Each timing
replays a graph over LAYERS copies of the experts' weights, each with its own random
routing, so a step reads weights from HBM, not from L2. For each (shape, dtype, T):
every GEMV tile of each kernel is timed alone, the best pair then runs the whole path
against the grouped path with the table's entry, and the entry gets "pairs" tiles when
the GEMVs are faster by more than MARGIN (and loses them otherwise). Shapes the table does
not have get grouped entries of the default tiles (moe_tiles.default_config) beside, at the
tile sweep's batch sizes, so larger steps keep what they had. GPT-OSS's experts are timed
without their biases (a bias is one row's load per program). For models with plain softmax
top-k routing the two paths are compared as they run, routing included: the routing kernel
then the grouped GEMMs, against the GEMVs routing in their own programs
(moe_pairs.pair_experts_routed); tiles are ranked without the routing either way.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch
import triton
from moe_tile_sweep import BATCHES, expert_shape, format_table, table_sweep_args
from triton.runtime.errors import OutOfResources

LAYERS = 6
MARGIN = 0.03
DEVICE, DTYPE = "cuda", torch.bfloat16  # (a dry run under Triton's interpreter swaps them)


def gemv_tiles(kind: str, top_k: int) -> list[dict]:
    """GEMV candidates for one kernel: a program's float32 accumulators (BLOCK_N x BLOCK_K
    for each of gate and up in the gated kernel; for each of the k slots, padded to a power
    of two, in the down kernel) kept to what its warps can hold in registers."""
    rows = 2 if kind == "gated" else triton.next_power_of_2(top_k)
    out = []
    for bn in (1, 2, 4, 8, 16, 32, 64):
        for bk in (64, 128, 256, 512):
            if not 1024 <= rows * bn * bk <= 16384 or (kind == "gated" and bn < 4):
                continue
            for warps in (4, 8):
                for stages in (1, 2):
                    out.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages))
    return out


class Case:
    """LAYERS copies of one shape's experts, each with a random routing of T tokens."""

    def __init__(
        self, shape, fp8: bool, tokens: int, routed: bool = False, seed: int = 0, layers=LAYERS
    ):
        from cadence.models.moe import route
        from cadence.quant.fp8_experts import quantize_experts

        experts, hidden, inter, top_k = shape
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        dev = dict(device=DEVICE, dtype=DTYPE)
        self.layers = []
        for _ in range(layers):
            w13 = torch.empty(experts, 2 * inter, hidden, **dev).uniform_(-0.02, 0.02, generator=g)
            w2 = torch.empty(experts, hidden, inter, **dev).uniform_(-0.02, 0.02, generator=g)
            s13 = s2 = None
            if fp8:
                w13, s13 = quantize_experts(w13)
                w2, s2 = quantize_experts(w2)
            # (logits in the activations' dtype, as the routers of the plainly routed models
            # give them; renormalised, as Qwen3's and Mixtral's are)
            logits = torch.randn(tokens, experts, device=DEVICE, generator=g).to(DTYPE)
            weights, ids = route(logits, top_k, True, DTYPE)
            x = torch.randn(tokens, hidden, **dev, generator=g)
            self.layers.append((x, w13, w2, ids, weights, s13, s2, logits))
        self.top_k, self.routed = top_k, routed

    def pairs_path(self, tiles: dict, routed: bool | None = None) -> list:
        """The GEMVs with `tiles`, routing in their own programs if `routed` (default: as
        this case's model routes)."""
        from cadence.ops import moe_pairs

        if self.routed if routed is None else routed:
            return [
                lambda layer=layer: moe_pairs.pair_experts_routed(
                    layer[0],
                    layer[7],
                    self.top_k,
                    True,
                    DTYPE,
                    *layer[1:3],
                    *layer[5:7],
                    tiles=tiles,
                )  # fmt: skip
                for layer in self.layers
            ]
        return [
            lambda layer=layer: moe_pairs.pair_experts(*layer[:5], layer[5], layer[6], tiles=tiles)
            for layer in self.layers
        ]

    def grouped_path(self, entry: dict) -> list:
        """fused_experts with the grouped GEMMs of `entry` (its "pairs" left out), after
        the routing kernel for a model that routes plainly."""
        from cadence.ops import fused_moe, moe_routing, moe_tiles

        grouped = {k: v for k, v in entry.items() if k != "pairs"}

        def run(layer):
            real = moe_tiles.config
            moe_tiles.config = lambda *args: grouped
            try:
                ids, weights = layer[3], layer[4]
                if self.routed:
                    weights, ids = moe_routing.topk_softmax(layer[7], self.top_k, True, DTYPE)
                return fused_moe.fused_experts(*layer[:3], ids, weights, layer[5], layer[6])
            finally:
                moe_tiles.config = real

        return [lambda layer=layer: run(layer) for layer in self.layers]

    def one_kernel(self, kind: str, tile: dict) -> list:
        """The pairs path with `tile` for `kind` and the default tile for the other (held
        fixed, so the whole path's time ranks `kind`'s tiles)."""
        from cadence.ops import moe_pairs

        tiles = dict(moe_pairs.DEFAULT_TILES)
        tiles[kind] = tile
        return self.pairs_path(tiles, routed=False)


def graph_us(calls: list, reps: int = 20) -> float:
    """Microseconds a call takes, replayed in one CUDA graph of all the calls (inf for a
    tile that does not fit the GPU or does not compile)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for call in calls:  # (compiles, and warms the allocator before capture)
                call()
    except (OutOfResources, triton.CompilationError) as e:
        print(f"   skipped: {type(e).__name__}", flush=True)
        return float("inf")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (reps * len(calls))


_CASE: dict[tuple, Case] = {}  # (a worker keeps one: the largest shape's weights are GBs)


def _compile(job: tuple) -> None:
    """Run one GEMV variant once in a worker: Triton compiles it into its disk cache (the
    kernels specialize on no size but k rounded up, so one shape per k serves all)."""
    from cadence.ops import moe_pairs

    shape, fp8, kind, tile, routed = job
    if (shape, fp8) not in _CASE:
        _CASE.clear()
        _CASE[(shape, fp8)] = Case(shape, fp8, 1, layers=1)
    case = _CASE[(shape, fp8)]
    with contextlib.suppress(OutOfResources, triton.CompilationError):  # (never a pick)
        if routed:  # (the gated GEMV routing for a model of this k and expert count)
            case.pairs_path(dict(moe_pairs.DEFAULT_TILES, gated=tile), routed=True)[0]()
        else:
            case.one_kernel(kind, tile)[0]()
    torch.cuda.synchronize()


def compile_jobs(shapes: list[tuple], routed: list[tuple]) -> list[tuple]:
    """One job per distinct kernel variant: (shape, fp8, kind, tile, routed), the smallest
    shape with each k rounded up to a power of two; and for each shape in `routed` (plain
    routing) its gated GEMVs that route, which specialize on k and the expert count."""
    by_pad: dict[int, tuple] = {}
    for shape in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
        by_pad.setdefault(triton.next_power_of_2(shape[3]), shape)
    jobs, seen = [], set()
    for fp8 in (False, True):
        for pad, shape in by_pad.items():
            for kind in ("gated", "down"):
                for tile in gemv_tiles(kind, shape[3]):
                    key = (fp8, kind, pad if kind == "down" else 0, tuple(tile.values()))
                    if key not in seen:
                        seen.add(key)
                        jobs.append((shape, fp8, kind, tile, False))
        for experts, _, _, top_k in routed:  # (a small shape of the same experts and k)
            small = (experts, 256, 256, top_k)
            jobs += [(small, fp8, "gated", tile, True) for tile in gemv_tiles("gated", top_k)]
    return jobs


def plain_routing(model_dir: str) -> bool:
    """Whether the model routes by softmax top-k alone into experts without biases
    (cadence/models/moe.py's plain_topk, GPT-OSS's biased experts aside)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return (
        cfg.get("model_type") != "gpt_oss"
        and cfg.get("scoring_func", "softmax") == "softmax"
        and (cfg.get("n_group") or 1) == 1
        and (cfg.get("routed_scaling_factor") or 1.0) == 1.0
    )


def keep_entry(entries: dict, tokens: int, entry: dict, won: bool) -> None:
    """Write a swept entry back: under its own size if the table has that size or the sweep
    changed what the step takes (else the size it was taken from keeps serving it)."""
    if str(tokens) in entries or won:
        entries[str(tokens)] = entry


def by_batch(entries: dict) -> dict:
    """The entries in order of their batch (the order moe_tiles reads them in)."""
    return dict(sorted(entries.items(), key=lambda p: int(p[0])))


def entry_for(entries: dict, tokens: int) -> dict:
    """The entry a step of `tokens` takes (moe_tiles.config's rule), as a copy."""
    ordered = list(by_batch(entries).items())
    return dict(next((e for b, e in ordered if int(b) >= tokens), ordered[-1][1]))


def sweep_case(case: Case, entry: dict) -> tuple[float, float, dict]:
    """(grouped us, pairs us, the pairs tiles) for one step size."""
    from cadence.ops import moe_pairs

    base = graph_us(case.pairs_path(moe_pairs.DEFAULT_TILES))
    picks = {}
    for kind in ("gated", "down"):
        timed = [(graph_us(case.one_kernel(kind, t)), t) for t in gemv_tiles(kind, case.top_k)]
        picks[kind] = min(timed, key=lambda p: p[0])[1]
    pairs = graph_us(case.pairs_path(picks))
    grouped = graph_us(case.grouped_path(entry))
    print(f"   default GEMV tiles {base:.1f} us", flush=True)
    return grouped, pairs, picks


def main() -> None:
    models = ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "deepseek-v2-lite"]
    ap = table_sweep_args(
        __doc__.split("\n")[0], [f"benchmarks/{m}" for m in models], [1, 2, 4, 8, 16, 32]
    )
    ap.add_argument("--jobs", type=int, default=14)
    args = ap.parse_args()
    from cadence.ops import moe_tiles

    out = Path(args.out or args.table)
    table = json.loads(Path(args.table).read_text()) if Path(args.table).exists() else {}
    table.setdefault("device", torch.cuda.get_device_name())
    table.setdefault("shapes", {})
    shapes = [expert_shape(m) for m in args.models]
    routed = [expert_shape(m) for m in args.models if plain_routing(m)]
    t0 = time.time()
    jobs = compile_jobs(shapes, routed)
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        pool.map(_compile, jobs, chunksize=4)
    print(f"compiled {len(jobs)} GEMV variants in {time.time() - t0:.0f} s", flush=True)
    for shape in shapes:
        experts, hidden, inter, top_k = shape
        for fp8 in (False, True):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            key = moe_tiles.shape_key(dtype, experts, hidden, inter)
            if key not in table["shapes"]:  # (grouped entries of the defaults beside)
                table["shapes"][key] = {
                    str(b): moe_tiles.default_config(b, top_k, experts) for b in BATCHES
                }
            entries = table["shapes"][key]
            for tokens in args.batches:
                entry = entry_for(entries, tokens)
                case = Case(shape, fp8, tokens, routed=shape in routed)
                grouped, pairs, picks = sweep_case(case, entry)
                chosen = pairs < grouped * (1 - MARGIN)
                entry.pop("pairs", None)
                if chosen:
                    entry["pairs"] = picks
                # (the entry a step of T takes becomes T's own, so a pick never moves
                # to another size)
                entries[str(tokens)] = entry
                entries = by_batch(entries)
                table["shapes"][key] = entries
                print(
                    f"{key} T={tokens}{' (routing included)' if case.routed else ''}: "
                    f"grouped {grouped:.1f} us, pairs {pairs:.1f} us "
                    f"({grouped / pairs:.2f}x) -> {'pairs' if chosen else 'grouped'} "
                    f"gated={picks['gated']} down={picks['down']}",
                    flush=True,
                )
                del case
                out.write_text(format_table(table))  # (a cut-short sweep keeps its part)
    print(f"wrote {out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
