"""One mixture-of-experts block of a GGUF file on the CPU, two ways in one process: the
torch reference (the pairs grouped on the host, each chosen expert's panels called on its
rows, one weighted index_add) and the one-call kernel (cadence/csrc/cpu/moe_panels.cpp),
us per block at a few token counts; then a whole greedy decode (ms per token, the MoE
blocks' share). Weights and routing are the file's (benchmarks/gguf_moe_file.py writes one).

    python benchmarks/gguf_moe_cpu.py FILE.gguf [--tokens 1 4 16] [--decode 64]
"""

from __future__ import annotations

import argparse
import time

import torch

from cadence import LLM, SamplingParams
from cadence.models import moe


def per_call_us(fn, repeats: int) -> float:
    for _ in range(max(10, repeats // 20)):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=1000)
    ap.add_argument("--decode", type=int, default=64, help="tokens of the greedy decode")
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_memory=256 * 2**20)  # (bf16 on a CPU: the blocks packed)
    model = llm.engine.runner.driver.model
    block = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, moe.SparseMoE))
    experts, opts = block.experts, block.options
    print(f"{args.model}: experts stacked for one call: {experts.gguf_stacks is not None}")
    for tokens in args.tokens:
        x = torch.randn(tokens, block.gate.weight.shape[1], dtype=torch.bfloat16)
        weights, ids = moe.route(block.gate(x), opts.top_k, opts.renormalize, x.dtype)
        routed = (x, ids, weights)
        ref = per_call_us(lambda r=routed: experts.forward_reference(*r), args.repeats)
        one = per_call_us(
            lambda r=routed: experts.quant_method.forward_cpu(experts, *r), args.repeats
        )
        print(f"T={tokens:3d}: reference {ref:8.1f} us   one call {one:8.1f} us   {ref / one:.2f}x")
    spent = [0.0]
    for layer in model.layers:
        inner = layer.mlp.forward

        def timed(*a, _inner=inner, **k):
            start = time.perf_counter()
            out = _inner(*a, **k)
            spent[0] += time.perf_counter() - start
            return out

        layer.mlp.forward = timed
    params = SamplingParams(temperature=0.0, max_tokens=args.decode, ignore_eos=True)
    llm.generate(["warm-up"], SamplingParams(max_tokens=4), use_tqdm=False)
    spent[0] = 0.0
    start = time.perf_counter()
    llm.generate(["The experts of a mixture"], params, use_tqdm=False)
    total = time.perf_counter() - start
    print(
        f"decode of {args.decode} tokens: {total / args.decode * 1e3:.1f} ms a token, "
        f"MoE blocks {spent[0] / args.decode * 1e3:.1f} ms of it"
    )


if __name__ == "__main__":
    main()
