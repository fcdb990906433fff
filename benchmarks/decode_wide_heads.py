"""Kernel B's decode settings for wide heads (Gemma 2's 256), end to end: one
`cadence bench latency` per setting with the module constants patched in-process.

    python benchmarks/decode_wide_heads.py benchmarks/gemma-2-9b "64,4,2" "64,8,2" "split:128"

A setting "BLOCK_N,warps,stages" replaces DECODE_SMALL (batch-1 decodes); "split:P" lets
decodes split their keys from contexts of 2P on, in partitions of at least P keys.
"""

from __future__ import annotations

import subprocess
import sys

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
