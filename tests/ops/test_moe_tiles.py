"""The MoE GEMMs' tile table (cadence/ops/moe_tiles.py): a step takes the entry of the
smallest swept batch at least its size, shapes and GPUs the sweep did not cover take the
defaults, and the table kept in the repository is well formed."""

from __future__ import annotations

import json

import torch

from cadence.ops import moe_tiles


def _entry(block_m: int) -> dict:
    tile = dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
    return {"BLOCK_M": block_m, "gated": tile, "down": tile}


def test_a_step_takes_the_smallest_swept_batch_that_holds_it(monkeypatch, tmp_path):
    key = moe_tiles.shape_key(torch.bfloat16, 128, 2048, 768)
    table = {"device": "NVIDIA H200", "shapes": {key: {"1": _entry(16), "64": _entry(64)}}}
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(moe_tiles, "TABLES", [path])
    monkeypatch.setattr(moe_tiles, "_device_name", lambda index: "NVIDIA H200 NVL")
    moe_tiles._tables.cache_clear()
    cuda = torch.device("cuda", 0)
    pick = lambda tokens, shape=(128, 2048, 768), dtype=torch.bfloat16: moe_tiles.config(  # noqa: E731
        cuda, dtype, shape, tokens, 8
    )
    assert pick(1)["BLOCK_M"] == 16
    assert pick(2)["BLOCK_M"] == 64 and pick(64)["BLOCK_M"] == 64
    assert pick(5000)["BLOCK_M"] == 64  # past the largest: the largest
    assert pick(1, shape=(8, 4096, 14336)) == moe_tiles.default_config(1, 8, 8)
    assert pick(1, dtype=torch.float8_e4m3fn) == moe_tiles.default_config(1, 8, 128)
    monkeypatch.setattr(moe_tiles, "_device_name", lambda index: "NVIDIA A100")
    moe_tiles._tables.cache_clear()
    assert pick(1) == moe_tiles.default_config(1, 8, 128)  # another GPU: not its table
    # On a CPU nothing is looked up.
    assert (
        moe_tiles.config(torch.device("cpu"), torch.bfloat16, (128, 2048, 768), 1, 8)["BLOCK_M"]
        == moe_tiles.default_config(1, 8, 128)["BLOCK_M"]
    )
    moe_tiles._tables.cache_clear()


def test_the_kept_table_is_well_formed():
    for path in moe_tiles.TABLES:
        if not path.exists():
            continue
        table = json.loads(path.read_text())
        assert table["device"]
        for key, entries in table["shapes"].items():
            for batch, entry in entries.items():
                assert int(batch) >= 1 and entry["BLOCK_M"] in (16, 32, 64, 128)
                assert set(entry) <= {"BLOCK_M", "gated", "down", "pairs", "grouped_mm", "w8a8"}
                # torch's grouped GEMM (scaled, for FP8 experts) never takes a GEMV-sized step
                assert entry.get("grouped_mm", True) is True
                if entry.get("grouped_mm"):
                    assert "pairs" not in entry and key.split()[0] in ("bf16", "fp16", "fp8")
                tile_keys = {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}
                for kind in ("gated", "down"):  # (a grouped GEMM's tile may order its programs)
                    assert tile_keys <= set(entry[kind]) <= tile_keys | {"GROUP_M"}
                    assert entry[kind].get("GROUP_M", 1) >= 1
                    if "pairs" in entry:
                        assert set(entry["pairs"][kind]) == tile_keys
                # the swapped W8A8 GEMMs: FP8 experts only, their own row block and tiles,
                # weight columns 64+ a program (the FP8 MMA's M side)
                if "w8a8" in entry:
                    w8a8 = entry["w8a8"]
                    assert key.startswith("fp8 ") and "pairs" not in entry
                    assert w8a8["BLOCK_M"] in (16, 32, 64, 128)
                    for kind in ("gated", "down"):
                        assert set(w8a8[kind]) == tile_keys and w8a8[kind]["BLOCK_N"] >= 64


def test_default_rows_blocks_grow_with_the_pairs_an_expert_gets():
    blocks = [moe_tiles.default_config(t, 8, 128)["BLOCK_M"] for t in (1, 64, 512, 4096)]
    assert blocks == sorted(blocks) and blocks[0] == 16 and blocks[-1] == 64
