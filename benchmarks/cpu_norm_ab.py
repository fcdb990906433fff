"""RMSNorms on a CPU in one kernel call where they were op by op until 2026-12-05: per-head q / k
norms (Qwen3, Qwen3-MoE, Gemma 3) and every Gemma norm (Gemma 2 / 3's four a layer). Both ways
in one process (layers/norm._cpu_norm patched to decline those): greedy decodes of 32 tokens,
alternating (ABBA order), ms a token, median of six each.

    python benchmarks/cpu_norm_ab.py MODEL [--dtype bfloat16]   # a GGUF file or checkpoint
"""

from __future__ import annotations

import argparse
import time

from cadence import LLM, SamplingParams
from cadence.layers import norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    llm = LLM(args.model, dtype=args.dtype, kv_cache_memory=256 * 2**20)
    fused = norm._cpu_norm

    def before(x, residual, weight, eps, gemma=False):
        return None if gemma or x.dim() == 3 else fused(x, residual, weight, eps, gemma)

    prompt = [{"prompt_token_ids": list(range(5, 37))}]  # (checkpoints without a tokenizer too)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompt, SamplingParams(max_tokens=4), use_tqdm=False)
    ms = {"one call": [], "op by op": []}
    pair = (("one call", fused), ("op by op", before))
    for r in range(args.rounds):
        for name, cpu_norm in pair if r % 2 == 0 else pair[::-1]:
            norm._cpu_norm = cpu_norm
            start = time.perf_counter()
            llm.generate(prompt, params, use_tqdm=False)
            ms[name].append((time.perf_counter() - start) / args.tokens * 1e3)
    norm._cpu_norm = fused
    for name, values in ms.items():
        values.sort()
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{name}: median {values[len(values) // 2]:.2f} ms a token ({runs})")


if __name__ == "__main__":
    main()
