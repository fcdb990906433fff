"""Per-head q / k RMSNorm on a CPU (Qwen3, Qwen3-MoE): the fused kernel, a row per head, against
the op-by-op torch norm it replaced, in one process: greedy decodes of 32 tokens, the two
alternating (ABBA order), ms a token, median of six each.

    python benchmarks/cpu_head_norm_ab.py MODEL   # a GGUF file or checkpoint with q / k norms
"""

from __future__ import annotations

import argparse
import time

from cadence import LLM, SamplingParams
from cadence.layers import norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_memory=256 * 2**20)
    fused = norm.RMSNorm.forward

    def op_by_op(self, x, residual=None):
        if x.dim() == 3 and residual is None:
            return self._norm(x)
        return fused(self, x, residual)

    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(["warm-up"], SamplingParams(max_tokens=4), use_tqdm=False)
    ms = {"fused": [], "op-by-op": []}
    pair = (("fused", fused), ("op-by-op", op_by_op))
    for r in range(args.rounds):
        for name, forward in pair if r % 2 == 0 else pair[::-1]:
            norm.RMSNorm.forward = forward
            start = time.perf_counter()
            llm.generate(["The experts of a mixture"], params, use_tqdm=False)
            ms[name].append((time.perf_counter() - start) / args.tokens * 1e3)
    norm.RMSNorm.forward = fused
    for name, values in ms.items():
        values.sort()
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{name}: median {values[len(values) // 2]:.2f} ms a token ({runs})")


if __name__ == "__main__":
    main()
