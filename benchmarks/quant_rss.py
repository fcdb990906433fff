"""Resident memory of an engine process holding SmolLM2 in each weight format (CPU).

    python benchmarks/quant_rss.py [gguf none ...]

One child process a format: RSS after imports, then after `LLM(...)` (16 MiB KV pool, so
the weights dominate what loading adds), and the bytes the model's tensors hold.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
import torch
from cadence import LLM
from cadence.loader.loader import weight_bytes
base = rss()
llm = LLM(quantization=sys.argv[1], dtype="bfloat16", kv_cache_memory=16 * 2**20)
print(f"{sys.argv[1]:6s} RSS after imports {base:5.0f} MiB, with the engine {rss():5.0f} MiB "
      f"(+{rss() - base:.0f}); model tensors {weight_bytes(llm.engine.runner.driver.model) / 2**20:.0f} MiB")
"""


def main() -> None:
    for fmt in sys.argv[1:] or ["gguf", "none"]:
        out = subprocess.run([sys.executable, "-c", CHILD, fmt], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
