"""Sweep the tiles of the mixture-of-experts grouped GEMMs (cadence/ops/fused_moe.py) on
this GPU and write the table cadence/ops/moe_tiles.py reads.

    python benchmarks/moe_tile_sweep.py --out cadence/ops/moe_tiles_h200.json \
        [--models benchmarks/qwen3-30b-a3b benchmarks/mixtral-8x7b] [--jobs 14]

For each model's expert shape (experts, hidden, intermediate), weight dtype (bf16, fp8)
and step size T (tokens), a random routing of T tokens (k distinct experts each) is
aligned once per row block BLOCK_M; each GEMM (gated, down) is timed for every tile of
that BLOCK_M; the entry keeps the BLOCK_M whose best gated + best down is fastest, with
those two tiles. It also reports what the default tiles (moe_tiles.default_config) take,
and each entry's bytes of expert weights read per microsecond (the bandwidth a step
reaches). Triton compiles every tile first, in --jobs processes (each compile is
CPU-bound, ~1-2 s); the timing then runs in this one process, one kernel at a time.
The table it writes has the default program order and no GEMVs: moe_group_sweep.py
(GROUP_M, large steps) and moe_pairs_sweep.py (small steps) decide those on top of it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def tiles(block_m: int) -> list[dict]:
    """The candidates for one row block: thin blocks read weights (decode: wide K runs,
    deep pipelines), tall ones multiply (prefill: wide N, more warps)."""
    out = []
    if block_m == 16:  # (narrow columns: at batch 1 only enough programs keep HBM busy)
        for bn in (16, 32, 64, 128):
            for bk in (64, 128, 256) if bn > 16 else (128, 256, 512):
                for stages in (2, 3, 4, 5):
                    out.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=stages))
    else:
        bks = (64,) if block_m == 128 else (64, 128)
        for bn in (64, 128):
            for bk in bks:
                for warps in (4, 8):
                    for stages in (3, 4):
                        out.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages))
    return out


def block_ms(tokens: int, top_k: int, experts: int) -> list[int]:
    per_expert = tokens * top_k / experts
    if per_expert < 8:
        return [16]
    if per_expert < 64:
        return [16, 32, 64]
    if per_expert < 512:
        return [32, 64, 128]
    return [64, 128]


def table_sweep_args(description: str, models: list[str], batches: list[int]):
    """The arguments of the sweeps that refine the kept table (moe_pairs_sweep.py,
    moe_group_sweep.py, moe_grouped_mm_sweep.py), the parser to add their own to."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--models", nargs="+", default=models)
    ap.add_argument("--table", default="cadence/ops/moe_tiles_h200.json")
    ap.add_argument("--out", default=None, help="where to write the table (default: --table)")
    ap.add_argument("--batches", type=int, nargs="+", default=batches)
    return ap


def expert_shape(model_dir: str) -> tuple[int, int, int, int]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return experts, cfg["hidden_size"], inter, cfg["num_experts_per_tok"]


class Case:
    """One (shape, dtype, T): weights, a routing and its alignments, ready to time."""

    def __init__(self, shape, fp8: bool, tokens: int, seed: int = 0) -> None:
        from cadence.quant.fp8_experts import quantize_experts

        experts, hidden, inter, top_k = shape
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = dict(device="cuda", dtype=torch.bfloat16)
        self.w13 = torch.empty(experts, 2 * inter, hidden, **dev).uniform_(-0.02, 0.02, generator=g)
        self.w2 = torch.empty(experts, hidden, inter, **dev).uniform_(-0.02, 0.02, generator=g)
        self.s13 = self.s2 = None
        if fp8:
            self.w13, self.s13 = quantize_experts(self.w13)
            self.w2, self.s2 = quantize_experts(self.w2)
        self.x = torch.randn(tokens, hidden, **dev, generator=g)
        scores = torch.rand(tokens, experts, device="cuda", generator=g)
        weights, self.ids = scores.topk(top_k, dim=1)
        self.weights = weights.to(torch.bfloat16)
        self.top_k, self.tokens, self.inter, self.hidden = top_k, tokens, inter, hidden
        self.aligned: dict[int, tuple] = {}

    def gemm(self, kind: str, block_m: int, tile: dict):
        """A thunk that runs one GEMM with this tile."""
        from cadence.ops import fused_moe, moe_routing

        if block_m not in self.aligned:
            sp, be = moe_routing.align(self.ids, self.w13.shape[0], block_m)
            act = torch.randn(sp.numel(), self.inter, device="cuda", dtype=torch.bfloat16)
            out13 = torch.empty_like(act)
            out2 = torch.empty(
                self.tokens * self.top_k, self.hidden, device="cuda", dtype=act.dtype
            )
            self.aligned[block_m] = (sp, be, act, out13, out2)
        sp, be, act, out13, out2 = self.aligned[block_m]
        common = (sp, be, self.weights.flatten(), self.tokens * self.top_k, self.top_k)
        full = dict(BLOCK_M=block_m, **tile)
        if kind == "gated":
            args = (self.x, self.w13, self.s13, out13, *common, full)
            flags = dict(GATED=True, ROUTE_SCALE=False)
        else:
            args = (act, self.w2, self.s2, out2, *common, full)
            flags = dict(GATED=False, ROUTE_SCALE=True)
        return lambda: fused_moe.launch_gemm(*args, **flags)

    def weight_bytes_read(self) -> int:
        """Bytes of expert weights a step reads: those of every expert some token chose."""
        chosen = torch.unique(self.ids).numel()
        per = (
            self.w13[0].numel() * self.w13.element_size()
            + self.w2[0].numel() * self.w2.element_size()
        )
        return chosen * per


def time_us(fn, reps: int = 10) -> float:
    """Mean microseconds a launch takes (inf for a tile that does not fit the GPU)."""
    try:
        fn()
    except OutOfResources:
        return float("inf")
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


_CASES: dict[tuple, Case] = {}


def _compile_jobs(shape) -> list[tuple]:
    """One job per distinct kernel: (fp8, kind, BLOCK_M, tile, tokens). Triton specializes
    on the pair count's divisibility by 16, so thin blocks compile for 1 and 2 tokens."""
    jobs = []
    for fp8 in (False, True):
        for bm in (16, 32, 64, 128):
            for tile in tiles(bm):
                for kind in ("gated", "down"):
                    for tokens in (1, 2) if bm == 16 else (256,):
                        jobs.append((shape, fp8, kind, bm, tile, tokens))
    return jobs


def _compile(job: tuple) -> None:
    """Run one kernel once in a worker process: Triton compiles it into its disk cache."""
    shape, fp8, kind, bm, tile, tokens = job
    key = (fp8, tokens)
    if key not in _CASES:
        _CASES[key] = Case(shape, fp8, tokens)
    with contextlib.suppress(OutOfResources):  # (too much shared memory: never a pick)
        _CASES[key].gemm(kind, bm, tile)()
    torch.cuda.synchronize()


def format_table(table: dict) -> str:
    """The table as JSON with one line per entry (a diff shows which entries moved)."""
    lines = ["{", f' "device": {json.dumps(table["device"])},', ' "shapes": {']
    for i, (key, entries) in enumerate(table["shapes"].items()):
        lines.append(f"  {json.dumps(key)}: {{")
        rows = [f"   {json.dumps(t)}: {json.dumps(e)}" for t, e in entries.items()]
        lines.append(",\n".join(rows))
        lines.append("  }" + ("," if i < len(table["shapes"]) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", nargs="+", default=["benchmarks/qwen3-30b-a3b", "benchmarks/mixtral-8x7b"]
    )
    ap.add_argument("--out", default="cadence/ops/moe_tiles_h200.json")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--max-tokens", type=int, default=BATCHES[-1])
    args = ap.parse_args()
    from cadence.ops import moe_tiles

    batches = [b for b in BATCHES if b <= args.max_tokens]
    shapes = [expert_shape(m) for m in args.models]
    t0 = time.time()
    jobs = _compile_jobs(min(shapes, key=lambda s: s[0] * s[1] * s[2]))
    # Compile in parallel processes; every shape then finds its kernels in Triton's cache.
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        pool.map(_compile, jobs, chunksize=4)
    print(f"compiled {len(jobs)} kernels in {time.time() - t0:.0f} s", flush=True)
    table = {"device": torch.cuda.get_device_name(), "shapes": {}}
    for shape in shapes:
        experts, hidden, inter, top_k = shape
        for fp8 in (False, True):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            key = moe_tiles.shape_key(dtype, experts, hidden, inter)
            entries = table["shapes"].setdefault(key, {})
            for tokens in batches:
                case = Case(shape, fp8, tokens)
                best = None
                for bm in block_ms(tokens, top_k, experts):
                    picks = {}
                    for kind in ("gated", "down"):
                        timed = [(time_us(case.gemm(kind, bm, t)), t) for t in tiles(bm)]
                        picks[kind] = min(timed, key=lambda p: p[0])
                    total = picks["gated"][0] + picks["down"][0]
                    if best is None or total < best[0]:
                        best = (total, bm, picks)
                total, bm, picks = best
                entries[str(tokens)] = {
                    "BLOCK_M": bm,
                    "gated": picks["gated"][1],
                    "down": picks["down"][1],
                }
                d = moe_tiles.default_config(tokens, top_k, experts)
                default = time_us(case.gemm("gated", d["BLOCK_M"], d["gated"])) + time_us(
                    case.gemm("down", d["BLOCK_M"], d["down"])
                )
                gbps = case.weight_bytes_read() / total / 1e3  # bytes / us / 1e3 = GB/s
                print(
                    f"{key} T={tokens}: {total:.1f} us (default tiles {default:.1f} us), "
                    f"weights read at {gbps:.0f} GB/s, BM={bm} "
                    f"gated={picks['gated'][1]} down={picks['down'][1]}",
                    flush=True,
                )
                del case
                Path(args.out).write_text(format_table(table))  # (a cut-short sweep keeps its part)
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
