"""Sweep the launch settings of the latent-attention kernel (cadence/attention/triton_mla.py)
on the GPU, at DeepSeek's widths (latent 512 + rope 64, bf16), timed in CUDA graphs.

    python benchmarks/mla_kernel_sweep.py [--heads 16] [--json PATH]

Prefill: 2 requests x 1,024 new tokens (the absorbed form's heaviest case: every query row
reads its whole causal context); decode: batch 1 at 384 keys and batch 64 at 1,280. Each
tile is (rows, keys per step, warps, stages); prints the best per case against the
module's current settings.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.testing import do_bench_cudagraph

import cadence.attention.triton_mla as mla
from cadence.attention.base import AttentionMetadata
from cadence.attention.triton_paged import TritonAttentionBackend

LATENT, ROPE, BLOCK = 512, 64, 16


def make_step(heads: int, query_lens: list[int], seq_lens: list[int]):
    """(q, cache, meta) of one step over random latents, contiguous block tables."""
    width = LATENT + ROPE
    blocks = [-(-s // BLOCK) for s in seq_lens]
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int64)
    at = 1
    for b, n in enumerate(blocks):
        tables[b, :n] = torch.arange(at, at + n)
        at += n
    cache = torch.randn(at, BLOCK, 1, width, dtype=torch.bfloat16, device="cuda")
    t = sum(query_lens)
    q = torch.randn(t, heads, width, dtype=torch.bfloat16, device="cuda")
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    meta = AttentionMetadata(
        num_tokens=t,
        query_start_loc=qsl.cuda(),
        seq_lens=torch.tensor(seq_lens, device="cuda"),
        slot_mapping=torch.zeros(t, dtype=torch.int64, device="cuda"),
        block_tables=tables.cuda(),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
        block_size=BLOCK,
    )
    backend = TritonAttentionBackend(num_kv_heads=1, split_kv=False)
    return q, cache, backend.build(meta)


def time_ms(q, cache, meta) -> float:
    fn = lambda: mla.mla_attention(q, cache, LATENT, meta, 0.1, 132)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=40)


def sweep(name: str, attr: str, step, tiles) -> dict:
    current = getattr(mla, attr)
    results = {}
    for tile in tiles:
        setattr(mla, attr, tile)
        try:
            results[str(tile)] = time_ms(*step)
        except Exception as exc:  # (a tile that does not fit: out of resources)
            results[str(tile)] = f"{type(exc).__name__}"
    setattr(mla, attr, current)
    timed = {k: v for k, v in results.items() if isinstance(v, float)}
    best = min(timed, key=timed.get)
    print(f"{name}: current {current} {results[str(current)]:.4f} ms; best {best} "
          f"{timed[best]:.4f} ms", flush=True)  # fmt: skip
    return {"current": str(current), "best": best, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    h = args.heads
    prefill_tiles = list(itertools.product((16, 32, 64), (16, 32, 64), (4, 8), (1, 2, 3)))
    decode_tiles = list(itertools.product((16,), (16, 32, 64, 128), (2, 4, 8), (1, 2, 3)))
    report = {
        "prefill_2x1024": sweep(
            "prefill 2 x 1024", "PREFILL_TILE", make_step(h, [1024, 1024], [1024, 1024]),
            prefill_tiles,
        ),
        "decode_b1_384": sweep("decode b1 @384", "DECODE_SMALL", make_step(h, [1], [384]),
                               decode_tiles),
        "decode_b64_1280": sweep("decode b64 @1280", "DECODE_LARGE",
                                 make_step(h, [1] * 64, [1280] * 64), decode_tiles),
    }  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
