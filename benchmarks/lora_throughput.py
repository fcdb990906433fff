"""Multi-LoRA throughput (issue 33): batch B at I -> O tokens with 0, 1, 8 and 32 distinct
adapters, as a fraction of the base model's throughput, on one engine per mode.

    python benchmarks/lora_throughput.py benchmarks/llama-3.1-8b --mode base --json b.json
    python benchmarks/lora_throughput.py benchmarks/llama-3.1-8b --mode lora --json l.json

Dummy weights for the base (--load-format dummy); the adapters are PEFT folders written
here with random rank-R weights on every projection (q, k, v, o, gate, up, down) of every
layer. Each case is one `generate` over fresh random prompt ids (EOS ignored, greedy); a
case runs twice and both are reported: the first reads its adapters from disk (the CPU
copies start empty), the second finds them in CPU memory (--max-cpu-loras 32), as a
server that has served them before. Start-up time is the LLM constructor's, per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch


def write_adapters(model: str, out: str, count: int, rank: int) -> list[str]:
    """`count` dummy PEFT folders over `model`'s shape (cadence.lora.dummy)."""
    from cadence.lora.dummy import write_dummy_adapter

    paths = []
    for i in range(count):
        path = os.path.join(out, f"adapter-{i}")
        if not os.path.exists(os.path.join(path, "adapter_model.safetensors")):
            write_dummy_adapter(model, path, rank, seed=i, device="cuda")
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--mode", choices=("base", "lora"), required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--counts", default="0,1,8,32", help="distinct adapters per case")
    ap.add_argument("--adapters-dir", default="/tmp/lora-adapters")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from cadence import LLM, LoRARequest, SamplingParams

    counts = [int(c) for c in args.counts.split(",")] if args.mode == "lora" else [0]
    paths = []
    if max(counts):
        t0 = time.perf_counter()
        paths = write_adapters(args.model, args.adapters_dir, max(counts), args.rank)
        print(f"adapters ready in {time.perf_counter() - t0:.1f} s", flush=True)
    kwargs = dict(load_format="dummy", dtype="bfloat16")
    if args.mode == "lora":
        kwargs.update(
            enable_lora=True,
            max_loras=args.max_loras,
            max_lora_rank=args.rank,
            max_cpu_loras=max(counts + [args.max_loras]),
        )
    t0 = time.perf_counter()
    llm = LLM(args.model, **kwargs)
    start_s = time.perf_counter() - t0
    print(f"{args.mode}: engine start {start_s:.1f} s", flush=True)
    vocab = llm.engine.vocab_size
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)

    def prompts(n: int) -> list[dict]:
        return [
            {"prompt_token_ids": [rng.randrange(vocab) for _ in range(args.input_len)]}
            for _ in range(n)
        ]

    llm.generate(prompts(8), SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    results = {"mode": args.mode, "start_s": start_s, "cases": []}
    for count in counts:
        loras = [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(paths[:count])]
        which = [loras[i % count] if count else None for i in range(args.batch)]
        for attempt in ("cold", "warm") if count else ("warm",):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = llm.generate(prompts(args.batch), params, use_tqdm=False, lora_request=which)
            seconds = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            case = {"adapters": count, "attempt": attempt, "seconds": seconds,
                    "output_tok_s": tokens / seconds}  # fmt: skip
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
