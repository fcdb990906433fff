"""Kernel B's decode settings for wide heads (Gemma 2's 256), end to end: one
`cadence bench latency` per setting with the module constants patched in-process.

    python benchmarks/decode_wide_heads.py benchmarks/gemma-2-9b "64,4,2" "64,8,2" "split:128"

A setting "BLOCK_N,warps,stages" replaces DECODE_SMALL (batch-1 decodes); "split:P" lets
decodes split their keys from contexts of 2P on, in partitions of at least P keys.

    python benchmarks/decode_wide_heads.py --large

times kernel B alone (CUDA-graph replays) over (BLOCK_N, warps, stages) for many decodes
(DECODE_WIDE_LARGE) at Gemma-2-9B's heads (16 query / 8 KV of 256, bf16): batch 64 at 138
and 1,280 keys, against the KV bytes each must read at 4.8 TB/s.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from types import SimpleNamespace


def sweep_large() -> None:
    sys.path.insert(0, "benchmarks")
    from attention_kernels import make_step, time_backend

    import cadence.attention.triton_paged as tp

    args = SimpleNamespace(block_size=16, kv_heads=8, head_dim=256, heads=16, dtype="bfloat16")
    current = tp.DECODE_WIDE_LARGE
    for batch, keys in ((64, 138), (64, 1280), (32, 138)):
        step = make_step([1] * batch, [keys] * batch, args)
        floor_us = batch * keys * 8 * 256 * 2 * 2 / 4.8e12 * 1e6
        results = {}
        for tile in itertools.product((16, 32, 64), (2, 4, 8), (1, 2, 3)):
            tp.DECODE_WIDE_LARGE = tile
            backend = tp.TritonAttentionBackend(num_kv_heads=8, head_dim=256, split_kv=False)
            try:
                results[tile] = time_backend(backend, step, 256**-0.5, graph=True)[1] * 1e3
            except Exception as exc:  # (a tile that does not fit)
                print(f"  {tile}: {type(exc).__name__}")
        best = min(results, key=results.get)
        print(f"b{batch} @{keys} keys (floor {floor_us:.1f} us): current {current} "
              f"{results[current]:.1f} us; best {best} {results[best]:.1f} us", flush=True)  # fmt: skip
        print(
            "  "
            + ", ".join(f"{t}: {v:.1f}" for t, v in sorted(results.items(), key=lambda x: x[1])[:6])
        )
    tp.DECODE_WIDE_LARGE = current


if sys.argv[1:2] == ["--large"]:
    sweep_large()
    sys.exit(0)

CHILD = """
import sys
import cadence.attention.triton_paged as tp
setting = sys.argv[1]
if setting.startswith("split:"):
    p = int(setting.split(":")[1])
    init = tp.TritonAttentionBackend.__init__
    def patched(self, *a, **kw):
        init(self, *a, **kw)
        self.split_min_partition, self.split_min_context = p, 2 * p
    tp.TritonAttentionBackend.__init__ = patched
else:
    tp.DECODE_SMALL = tuple(int(v) for v in setting.split(","))
sys.argv = ["cadence", "bench", "latency", sys.argv[2], "--load-format", "dummy",
            "--dtype", "bfloat16", "--batch-size", "1", "--input-len", "128",
            "--output-len", "256", "--num-iters", "2"]
from cadence.cli.main import main
main()
"""

for setting in sys.argv[2:]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, setting, sys.argv[1]], capture_output=True, text=True
    ).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith(("decode step", "decode:"))]
    print(setting, " | ".join(lines), flush=True)
