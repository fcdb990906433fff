"""KV capacity of a sliding-window model at long context (issue 31): how many sequences of
`--context` tokens the KV pool holds at once when requests release the blocks behind their
window, against holding every block. Every layer sliding (Mistral): one block list per
request. Interleaved local and global layers (Gemma 2/3): a list per KV group, the global
group holding everything, the local ones their window; a block is then one group's share
of the layers, and "without release" is every group holding the whole context.

Runs `--requests` sequences of random prompt ids through the engine step by step and
records, measured: the pool's size, the most requests running at once, and the blocks a
decoding sequence holds (the engine's own accounting). "Without release" is each
sequence's full context in blocks, the same pool divided by it.

    python benchmarks/window_capacity.py benchmarks/mistral-7b-v0.1 --load-format dummy \\
        --dtype bfloat16 --context 32000 --requests 40 --json out.json

(PYTHONPATH must name the checkout, as for the other scripts here.)
"""

from __future__ import annotations

import argparse
import json
import random
import time

from cadence import LLM, SamplingParams
from cadence.core.block import RELEASED_BLOCK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--context", type=int, default=32000, help="prompt tokens per sequence")
    ap.add_argument("--max-tokens", type=int, default=256, help="long enough to overlap")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--num-gpu-blocks-override", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--async-scheduling", action="store_true", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    kw = dict(load_format=args.load_format, dtype=args.dtype)
    for name in ("device", "num_gpu_blocks_override", "max_num_batched_tokens", "async_scheduling"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    llm = LLM(args.model, max_model_len=args.context + args.max_tokens, **kw)
    engine = llm.engine
    kv = engine.kv
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    vocab = engine.vocab_size
    for i in range(args.requests):
        ids = [rng.randrange(vocab) for _ in range(args.context)]
        engine.add_request(f"r{i}", ids, params)
    peak_running = peak_decode_blocks = 0
    peak_detail: dict = {}  # the sequence at the peak: where its blocks are
    # request id -> (its preemptions, its computed tokens) after the last step it ran in
    computed: dict[str, tuple[int, int]] = {}
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        running = engine.scheduler.running
        peak_running = max(peak_running, len(running))
        for req in running:
            # Counted in steps where it decoded one token, past the step that released its
            # last prompt chunk's window (not in a step that recomputed it after preemption:
            # a chunk's queries read every block of their windows, so it holds them all).
            last = computed.get(req.request_id)
            now = (req.num_preemptions, req.num_computed_tokens)
            computed[req.request_id] = now
            if req.num_output_tokens >= 2 and last == (now[0], now[1] - 1):
                rid = req.request_id
                per_group = [
                    sum(1 for b in g.req_blocks.get(rid, []) if b is not RELEASED_BLOCK)
                    for g in kv.groups
                ]
                held = sum(per_group)
                if held > peak_decode_blocks:
                    peak_decode_blocks = held
                    peak_detail = {
                        "request": rid,
                        "computed_tokens": req.num_computed_tokens,
                        "output_tokens": req.num_output_tokens,
                        "preempted": req.num_preemptions,
                        "held_per_group": per_group,
                        "released_per_group": [g.num_released.get(rid, 0) for g in kv.groups],
                        "cached_per_group": [g.num_cached.get(rid, 0) for g in kv.groups],
                    }
    elapsed = time.perf_counter() - t0
    bs = kv.block_size
    full = -(-(args.context + args.max_tokens) // bs) * len(kv.groups)
    result = {
        "model": args.model,
        "kv_group_windows": [g.window for g in kv.groups],
        "block_size": bs,
        "pool_blocks": kv.pool.num_blocks,
        "context": args.context,
        "requests": args.requests,
        "peak_running": peak_running,
        "blocks_per_decoding_sequence": peak_decode_blocks,
        "blocks_per_sequence_without_release": full,
        "sequences_held_with_release": kv.pool.num_blocks // max(peak_decode_blocks, 1),
        "sequences_held_without_release": kv.pool.num_blocks // full,
        "capacity_gain": full / max(peak_decode_blocks, 1),
        "window_releases": kv.num_window_releases,
        "preemptions": engine.scheduler.num_preemptions,
        "peak_sequence": peak_detail,
        "seconds": round(elapsed, 1),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
