"""What the step timeline costs (issue 19): is it cheap enough to stay on by default?

    python benchmarks/step_timeline_cost.py [MODEL] [--load-format dummy] [--dtype bfloat16]
        [--batch-sizes 1,64] [--input-len 128] [--output-len 256] [--rounds 3] [--json PATH]

1. Bookkeeping alone: begin() + five lap()s + commit() per step, timed over 200,000 steps,
   with the ring on (1,024 steps) and off (size 0).
2. In the engine: one LLM, the same batch decoded with the timeline on and off in
   alternating order (on/off, off/on, ...), so drift and warm-up fall on both sides; the
   figure is the median decode step (ms) of each side and their ratio.
MODEL defaults to SmolLM2 (the package's GGUF file).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from types import SimpleNamespace

from cadence.engine import step_timeline as tl
from cadence.engine.step_timeline import StepTimeline
from cadence.sampling_params import SamplingParams


def bookkeeping_us(size: int, steps: int = 200_000) -> float:
    sched = SimpleNamespace(
        is_empty=False,
        total_num_scheduled_tokens=64,
        num_scheduled_tokens={f"r{i}": 1 for i in range(64)},
        num_decode_seqs=64,
        num_decode_tokens=64,
        preempted_ids=[],
    )
    timeline = StepTimeline(size)
    t0 = time.perf_counter()
    for _ in range(steps):
        timeline.begin()
        for phase in (tl.SCHEDULE, tl.PREPARE, tl.FORWARD, tl.SAMPLE, tl.OUTPUT):
            timeline.lap(phase)
        timeline.commit(sched)
        timeline.add_output_time(1e-6)
    return (time.perf_counter() - t0) / steps * 1e6


def decode_steps_ms(engine, batch: int, input_len: int, output_len: int, rng, tag: str):
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(batch):
        prompt = [rng.randrange(engine.vocab_size) for _ in range(input_len)]
        engine.add_request(f"{tag}-{i}", prompt, params)
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[3:]  # the prefill steps and the first decodes (async start) aside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    result: dict = {
        "bookkeeping_us_per_step": {"on": bookkeeping_us(1024), "off": bookkeeping_us(0)}
    }
    book = result["bookkeeping_us_per_step"]
    print(f"bookkeeping per step: {book['on']:.2f} us on, {book['off']:.2f} us off")
    from cadence import LLM

    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, skip_tokenizer_init=True)
    engine = llm.engine
    rng = random.Random(0)
    decode_steps_ms(engine, 2, args.input_len, 8, rng, "warm")
    result["engine"] = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        ms: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                engine.timeline = StepTimeline(1024 if mode == "on" else 0)
                steps = decode_steps_ms(
                    engine, batch, args.input_len, args.output_len, rng, f"{mode}{r}b{batch}"
                )
                ms[mode].append(statistics.median(steps))
        on, off = statistics.median(ms["on"]), statistics.median(ms["off"])
        row = {"batch": batch, "on_ms": on, "off_ms": off, "ratio": on / off, "rounds": ms}
        result["engine"].append(row)
        print(
            f"batch {batch}: decode step {on:.3f} ms with the timeline, {off:.3f} ms without "
            f"({100 * (on / off - 1):+.2f} %; per-round medians on {ms['on']}, off {ms['off']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
