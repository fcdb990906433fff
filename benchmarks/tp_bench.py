"""Issue 15's cases for one engine configuration, in one process (one start-up):

    start       process start -> engine ready (and the first request's first token)
    batch 1     128 -> 256 greedy, decode tok/s (median step; 3 runs after a warm-up)
    batch 64    128 -> 256, output tok/s end to end (64 x 256 / mean latency; 3 runs)
    256 x 1024  256 prompts of 1,024 -> 256, output tok/s (`cadence bench throughput`'s way)

Timing as `cadence bench latency` / `throughput` (cadence/bench/offline.py). Dummy weights,
EOS ignored. Run once per configuration, on the same machine, for ratios from one lease:

    python benchmarks/tp_bench.py benchmarks/llama-3.1-8b -tp 2 [--disable-custom-all-reduce]
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--disable-custom-all-reduce", action="store_true")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--cases", default="b1,b64,tput")
    ap.add_argument("--json")
    args = ap.parse_args()

    import logging

    from cadence import LLM, SamplingParams
    from cadence.bench.offline import _one_batch

    logging.basicConfig(
        level=logging.INFO, format="%(relativeCreated)8.0f ms %(name)s: %(message)s"
    )
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        tensor_parallel_size=args.tensor_parallel_size,
        disable_custom_all_reduce=args.disable_custom_all_reduce,
        enforce_eager=args.enforce_eager,
    )
    ready_s = time.perf_counter() - T0
    engine = llm.engine
    rng = random.Random(0)
    vocab = engine.vocab_size

    def prompts(batch: int, length: int) -> list[list[int]]:
        return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]

    first = _one_batch(engine, prompts(1, 128), 1, "first")
    result = {
        "tp": args.tensor_parallel_size,
        "custom_all_reduce": not args.disable_custom_all_reduce,
        "enforce_eager": args.enforce_eager,
        "start_to_ready_s": ready_s,
        "start_to_first_token_s": ready_s + first.total,
    }
    cases = args.cases.split(",")
    for batch in (1, 64):
        if f"b{batch}" not in cases:
            continue
        runs = [_one_batch(engine, prompts(batch, 128), 256, f"b{batch}-{i}") for i in range(4)]
        runs = runs[1:]  # the first is a warm-up
        steps = [s for r in runs for s in r.decode_steps]
        result[f"b{batch}"] = {
            "median_step_ms": statistics.median(steps) * 1e3,
            "decode_tok_s": batch / statistics.median(steps),
            "output_tok_s": batch * 256 / statistics.mean(r.total for r in runs),
            "latency_s": [r.total for r in runs],
        }
    if "tput" in cases:
        reqs = [{"prompt_token_ids": p} for p in prompts(256, 1024)]
        params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
        llm.generate(reqs[:4], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        t = time.perf_counter()
        outs = llm.generate(reqs, params, use_tqdm=False)
        elapsed = time.perf_counter() - t
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        result["tput_256x1024"] = {"elapsed_s": elapsed, "output_tok_s": n / elapsed,
                                   "preemptions": engine.stats().num_preemptions}  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
