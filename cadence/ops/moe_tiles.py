"""Tile sizes of the mixture-of-experts GEMMs (cadence/ops/fused_moe.py), per GPU, expert
shape and batch.

A table from the sweep (benchmarks/moe_tile_sweep.py), kept in moe_tiles_h200.json:

    {"device": "NVIDIA H200",
     "shapes": {"bf16 E=128 H=2048 I=768": {"1": {"BLOCK_M": 16, "gated": {...},
                                                  "down": {...}}, "64": ..., ...}}}

keyed by the weights' dtype and each rank's (experts, hidden, intermediate), then by tokens
in the step: a step of T tokens takes the entry of the smallest batch >= T (the largest if
none). BLOCK_M is shared by both GEMMs (the alignment pads runs to it); "gated" is the
first GEMM's tile (columns of the intermediate, gate and up at once), "down" the second's;
a tile's optional GROUP_M (benchmarks/moe_group_sweep.py) has its programs walk that many
row blocks across every column tile before the next ones, so a prefill's rows stay in L2.
An entry with "pairs": {"gated": {...}, "down": {...}} (BLOCK_N, BLOCK_K, num_warps,
num_stages each) sends steps of that size to cadence/ops/moe_pairs.py's GEMVs, one program
per (token, slot) pair, where benchmarks/moe_pairs_sweep.py timed them faster than the
grouped GEMMs with the entry's own tiles (kept beside, for the next sweep to compare).
An entry with "grouped_mm": true sends steps of that size to torch's grouped GEMM
(cadence/ops/moe_grouped_mm.py; the scaled FP8 one under an "fp8" shape), where
benchmarks/moe_grouped_mm_sweep.py timed it faster than these tiles (biased experts keep
the tiles).
An entry of FP8 experts with "w8a8": {"BLOCK_M": ..., "gated": {...}, "down": {...}} sends
steps of that size to cadence/ops/moe_w8a8.py's swapped W8A8 GEMMs with those tiles, where
benchmarks/moe_w8a8_sweep.py timed them faster than the entry's own (W8A16) tiles.
Shapes or GPUs the table does not name take `default_config`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

TABLES = [Path(__file__).with_name("moe_tiles_h200.json")]


def shape_key(dtype: torch.dtype, experts: int, hidden: int, intermediate: int) -> str:
    tag = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype)
    tag = tag or ("fp8" if dtype == torch.float8_e4m3fn else str(dtype))
    return f"{tag} E={experts} H={hidden} I={intermediate}"


def default_config(tokens: int, top_k: int, experts: int) -> dict:
    """A sensible tile where the sweep did not run: row blocks about as tall as the pairs
    an expert gets."""
    per_expert = tokens * top_k / max(experts, 1)
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64
    tile = dict(BLOCK_N=64, BLOCK_K=64 if block_m > 16 else 128, num_warps=4, num_stages=3)
    return dict(BLOCK_M=block_m, gated=tile, down=dict(tile))


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.cache
def _tables(device_name: str) -> dict[str, list[tuple[int, dict]]]:
    """shape key -> [(batch, entry)] sorted by batch, from the tables for this GPU (read
    once: every layer of every eager step looks its tiles up)."""
    shapes: dict = {}
    for path in TABLES:
        if path.exists():
            table = json.loads(path.read_text())
            if table.get("device") and table["device"] in device_name:
                shapes.update(table.get("shapes", {}))
    return {
        key: sorted(((int(b), e) for b, e in entries.items()), key=lambda p: p[0])
        for key, entries in shapes.items()
    }


def config(
    device: torch.device,
    dtype: torch.dtype,
    shape: tuple[int, int, int],
    tokens: int,
    top_k: int,
) -> dict:
    """The tiles for a step of `tokens` tokens through experts of `shape` = (experts,
    hidden, intermediate) whose weights are `dtype`."""
    entries = None
    if device.type == "cuda":
        entries = _tables(
            _device_name(torch.cuda.current_device() if device.index is None else device.index)
        ).get(shape_key(dtype, *shape))
    if not entries:
        return default_config(tokens, top_k, shape[0])
    return next((entry for batch, entry in entries if batch >= tokens), entries[-1][1])
