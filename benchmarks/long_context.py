"""Decode speed and time to first token for long prompts, offline, as issue 13 measures.

    python benchmarks/long_context.py MODEL [--cases 1x8000,8x4000,1x128,64x128,1x32000]
        [--output-len 256] [--enforce-eager] [--json PATH]

For each case BxL (B prompts of L random token ids, fresh for every call so no prefix-cache
hit), greedy, EOS ignored: T_1 is the wall time of one `LLM.generate` with max_tokens=1 and
T_N with max_tokens=N (best of two each, after one untimed call). Then

    decode tok/s = B * (N - 1) / (T_N - T_1)      time to first token = T_1

and the step's bandwidth bound: (weight bytes + K/V bytes of the batch's mean context) /
measured HBM bandwidth (benchmarks/hbm_bandwidth.py), against the measured step time.
The run also counts Triton compiles after the engine said ready (0 is the goal).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

sys.path.insert(0, "benchmarks")

COMPILES: list[str] = []


def _count_compiles() -> None:
    """Record the name of every Triton kernel compiled from now on."""
    from triton.runtime.jit import JITFunction

    original = JITFunction._do_compile

    def compile_and_record(self, *args, **kwargs):
        COMPILES.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    JITFunction._do_compile = compile_and_record


def _prompts(rng: random.Random, batch: int, length: int, vocab: int) -> list[dict]:
    return [
        {"prompt_token_ids": [rng.randrange(vocab) for _ in range(length)]} for _ in range(batch)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--cases", default="1x8000,8x4000,1x128,64x128,1x32000")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--cuda-graph-prefill", action="store_true")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8")
    ap.add_argument("--quantization", default="auto", help="auto | none | fp8")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="default: measure it")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from cadence import LLM, SamplingParams

    hbm = args.hbm_gbps
    if hbm is None:
        from hbm_bandwidth import measure

        hbm = measure()
    _count_compiles()
    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enforce_eager=args.enforce_eager,
        cuda_graph_prefill=args.cuda_graph_prefill,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
    )
    start_s = time.perf_counter() - t0
    compiles_at_start = len(COMPILES)
    runner = llm.engine.runner.driver
    model = runner.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:  # the embedding table is gathered, not read whole
        weight_bytes -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    kv_per_token = runner._kv_bytes_per_block() / runner.block_size
    vocab = runner.vocab_size
    rng = random.Random(0)
    n = args.output_len

    def timed(batch: int, length: int, max_tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        prompts = _prompts(rng, batch, length, vocab)
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t

    results = {"hbm_gbps": hbm, "engine_start_s": start_s, "weight_bytes": weight_bytes}
    print(f"engine ready in {start_s:.1f} s ({compiles_at_start} Triton compiles); "
          f"HBM {hbm:.0f} GB/s; weights {weight_bytes / 1e9:.2f} GB; KV cache "
          f"{str(runner.kv_dtype).removeprefix('torch.')}, {runner.num_blocks} blocks",
          flush=True)  # fmt: skip
    for case in args.cases.split(","):
        batch, length = (int(x) for x in case.split("x"))
        before = len(COMPILES)
        timed(batch, length, 2)  # untimed: first use of this shape
        t1 = min(timed(batch, length, 1) for _ in range(2))
        tn = min(timed(batch, length, n) for _ in range(2))
        step_s = (tn - t1) / (n - 1)
        tok_s = batch * (n - 1) / (tn - t1)
        ctx = length + n / 2  # mean context over the decode
        bound_s = (weight_bytes + batch * ctx * kv_per_token) / (hbm * 1e9)
        row = {
            "batch": batch,
            "input_len": length,
            "output_len": n,
            "t1_s": t1,
            "tn_s": tn,
            "decode_tok_s": tok_s,
            "step_ms": step_s * 1e3,
            "bound_ms": bound_s * 1e3,
            "pct_of_bound": 100 * bound_s / step_s,
            "new_compiles": COMPILES[before:],
        }
        results[case] = row
        print(
            f"{case:>8} -> {n}: decode {tok_s:8.1f} tok/s ({step_s * 1e3:.2f} ms/step, bound "
            f"{bound_s * 1e3:.2f} ms = {row['pct_of_bound']:.0f} %); T_1 {t1 * 1e3:.0f} ms; "
            f"compiles during the case: {len(row['new_compiles'])} {row['new_compiles']}",
            flush=True,
        )
    results["compiles_after_ready"] = COMPILES[compiles_at_start:]
    print(f"Triton compiles after the engine was ready: {len(COMPILES) - compiles_at_start} "
          f"{COMPILES[compiles_at_start:]}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
