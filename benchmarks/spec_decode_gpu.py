"""Issue 16, GPU: what a verify step costs, and what a draft model costs, Llama-3.1-8B shape.

    verify   one engine with speculation on and a stand-in proposer that always guesses
             D tokens (wrong ones: every step yields one token, so contexts stay put):
             the median engine step at batch 1, 8, 64 for D = 0 (a plain decode step,
             synchronous), 1, 2, 4, 8, i.e. k + 1 = 1, 2, 3, 5, 9 tokens a sequence
    plain    the engine without speculation (async scheduling, decode graphs): its median
             decode step at batch 1, 8, 64, the baseline the ratios divide by
    draft    speculation with a draft model (--draft PATH, dummy weights, the target's
             seed): the draft's own time per step (catch-up + k - 1 guesses), the
             acceptance length and output tok/s at batch 1, 8, 64. With the target's own
             config as the draft (an identical model), every guess should be accepted and
             tok/s should be the ceiling (k + 1) / (verify step + draft time)

Each mode runs in its own process (one engine per process); prompts are 128 random tokens,
EOS ignored, greedy. Prints one JSON line per measurement.

    python benchmarks/spec_decode_gpu.py verify benchmarks/llama-3.1-8b
    python benchmarks/spec_decode_gpu.py plain benchmarks/llama-3.1-8b
    python benchmarks/spec_decode_gpu.py draft benchmarks/llama-3.1-8b --draft benchmarks/llama-3.2-1b
    python benchmarks/spec_decode_gpu.py draft benchmarks/llama-3.1-8b --method eagle3 \
        --draft benchmarks/eagle3-llama-3.1-8b      # an EAGLE-3 head's shape: its cost
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

BATCHES = (1, 8, 64)  # (SPEC_BENCH_QUICK=1: 1, 2)
PROMPT_LEN = 128
STEPS = 40


def make_llm(args, spec=None):
    from cadence import LLM

    return LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=4096,
        skip_tokenizer_init=True,
        speculative_config=spec,
    )


def add_batch(engine, batch: int, tag: str) -> None:
    from cadence import SamplingParams

    rng = random.Random(batch)
    params = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True)
    for i in range(batch):
        prompt = [rng.randrange(10, engine.vocab_size) for _ in range(PROMPT_LEN)]
        engine.add_request(f"{tag}-{i}", prompt, params)


def settle(engine, batch: int) -> None:
    """Step until every request is decoding (prefills done, graphs warm)."""
    for _ in range(200):
        engine.step()
        reqs = engine.scheduler.running
        if len(reqs) == batch and all(r.num_output_tokens >= 3 for r in reqs):
            return
    raise RuntimeError("requests did not reach decoding")


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_steps(engine, n: int = STEPS) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    sync()
    return times


def profile(engine, name: str, steps: int = 10) -> None:
    """torch.profiler over a few steps: where the time goes, host and device."""
    import torch
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        wall = sum(timed_steps(engine, steps))
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) / steps
    print(
        f"== profile {name}: wall {wall / steps * 1e3:.2f} ms/step, GPU busy "
        f"{gpu_us / 1e3:.2f} ms/step",
        flush=True,
    )
    print(events.table(sort_by="self_device_time_total", row_limit=12), flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


def finish(engine) -> None:
    engine.abort(list(engine.scheduler.requests))
    engine.flush()
    while engine.has_unfinished_requests():
        engine.step()


def mode_verify(args) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 8}
    llm = make_llm(args, spec)
    engine = llm.engine
    proposer = engine.runner.driver.drafter.proposer
    guess = {"n": 0}

    def fixed(step, caps):
        return [[7] * min(guess["n"], c) if s else [] for s, c in zip(step.sampled, caps)]

    proposer.propose = fixed
    for batch in BATCHES:
        add_batch(engine, batch, f"v{batch}")
        settle(engine, batch)
        for drafts in (0, 1, 2, 4, 8):
            guess["n"] = drafts
            timed_steps(engine, 3)  # the proposals of the old setting drain
            t = statistics.median(timed_steps(engine))
            print(
                json.dumps(
                    {
                        "mode": "verify",
                        "batch": batch,
                        "tokens_per_seq": drafts + 1,
                        "step_ms": t * 1e3,
                    }
                ),
                flush=True,
            )
            if args.profile and batch == 1 and drafts in (0, 4):
                profile(engine, f"verify b1 {drafts + 1} tokens")
        finish(engine)


def mode_plain(args) -> None:
    engine = make_llm(args).engine
    for batch in BATCHES:
        add_batch(engine, batch, f"p{batch}")
        settle(engine, batch)
        t = statistics.median(timed_steps(engine))
        print(
            json.dumps(
                {
                    "mode": "plain",
                    "batch": batch,
                    "step_ms": t * 1e3,
                    "async": engine.config.scheduler.async_scheduling,
                }
            ),
            flush=True,
        )
        if args.profile and batch == 1:
            profile(engine, "plain b1")
        finish(engine)


def mode_draft(args) -> None:
    spec = {"method": args.method, "model": args.draft, "num_speculative_tokens": args.k}
    engine = make_llm(args, spec).engine
    proposer = engine.runner.driver.drafter.proposer
    draft_times: list[float] = []
    inner = proposer.propose

    def timed(step, caps):
        sync()
        t0 = time.perf_counter()
        out = inner(step, caps)  # (reads its guesses back: synchronous)
        draft_times.append(time.perf_counter() - t0)
        return out

    proposer.propose = timed
    stats = engine.scheduler.spec_stats
    for batch in BATCHES:
        add_batch(engine, batch, f"d{batch}")
        settle(engine, batch)
        draft_times.clear()
        v0, a0 = stats.num_verifications, stats.num_accepted_tokens
        out0 = sum(r.num_output_tokens for r in engine.scheduler.running)
        t0 = time.perf_counter()
        steps = timed_steps(engine)
        wall = time.perf_counter() - t0
        out1 = sum(r.num_output_tokens for r in engine.scheduler.running)
        v, a = stats.num_verifications - v0, stats.num_accepted_tokens - a0
        print(
            json.dumps(
                {
                    "mode": "draft",
                    "method": args.method,
                    "draft": args.draft,
                    "k": args.k,
                    "batch": batch,
                    "step_ms": statistics.median(steps) * 1e3,
                    "draft_ms": statistics.median(draft_times) * 1e3,
                    "acceptance_length": (a + v) / v if v else 0.0,
                    "output_tok_s": (out1 - out0) / wall,
                }
            ),
            flush=True,
        )
        if args.profile and batch == 1:
            profile(engine, f"draft b1 {args.draft}")
        finish(engine)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["verify", "plain", "draft"])
    ap.add_argument("model")
    ap.add_argument("--draft")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--method", default="draft_model", choices=["draft_model", "eagle3"])
    ap.add_argument("--profile", action="store_true", help="torch.profiler tables at batch 1")
    args = ap.parse_args()
    {"verify": mode_verify, "plain": mode_plain, "draft": mode_draft}[args.mode](args)


if __name__ == "__main__":
    main()
