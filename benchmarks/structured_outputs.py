"""Structured outputs: what the grammar masks cost per step, throughput with and without
constraints on the same prompts, and what jump-forward saves. Offline, one process.

    .venv/bin/python benchmarks/structured_outputs.py            # SmolLM2, dtype auto
    .venv/bin/python benchmarks/structured_outputs.py --batch-sizes 1 32 --max-tokens 256

Grammar time per step is measured inside the real engine loop by timing the three places
the grammar touches a step: filling the bitmask (CPU), applying it to the logits, and
advancing the matchers (accept the sampled token, find forced tokens). Step time is the
whole `EngineCore.step()`. The prompts are the schema cases of the test suite, cycled to
the batch size. Three runs per batch size: constrained (masks only), constrained with
jump-forward, and unconstrained with EOS ignored and each request's max_tokens set to its
constrained length, so the free run does the same number of tokens and steps and the
throughput ratio isolates the grammar's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "structured"))

from schema_cases import SCHEMA_CASES  # noqa: E402

from cadence import LLM, SamplingParams  # noqa: E402
from cadence.layers import sampler as sampler_module  # noqa: E402
from cadence.sampling_params import StructuredOutputsParams  # noqa: E402


class StepTimer:
    """Per step: wall time of step() and of the grammar's three parts, and the rows that
    sampled (the batch size the mask was built for)."""

    PARTS = ("fill", "apply", "advance")

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def wrap_step(self, fn):
        def timed(*args, **kwargs):
            self.current = dict.fromkeys(("step", "rows", *self.PARTS), 0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current["step"] = time.perf_counter() - t0
                self.steps.append(self.current)
                self.current = None

        return timed

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.current is not None:
                    self.current[name] += time.perf_counter() - t0
                    if name == "fill":
                        self.current["rows"] = len(args[0])

        return timed

    def summary(self, rows: int | None = None) -> dict[str, float]:
        """Median ms per step of each part, over steps that sampled `rows` rows if given
        (the median keeps the one long prefill step out of a decode figure)."""
        steps = [s for s in self.steps if rows is None or s["rows"] == rows]
        out = {
            f"{k}_ms": 1e3 * statistics.median(s[k] for s in steps) if steps else 0.0
            for k in ("step", *self.PARTS)
        }
        out["steps_measured"] = len(steps)
        grammar = sum(out[f"{k}_ms"] for k in self.PARTS)
        out["grammar_ms"] = grammar
        out["grammar_pct"] = 100 * grammar / out["step_ms"] if out["step_ms"] else 0.0
        return out


@contextmanager
def instrumented(llm: LLM):
    """Time step(), bitmask fill, bitmask apply and matcher advance in the live engine."""
    timer = StepTimer()
    core, grammars = llm.engine, llm.engine.grammars
    saved = (core.step, grammars.fill_bitmask, grammars.advance, sampler_module.apply_token_bitmask)
    core.step = timer.wrap_step(core.step)
    grammars.fill_bitmask = timer.wrap("fill", grammars.fill_bitmask)
    grammars.advance = timer.wrap("advance", grammars.advance)
    sampler_module.apply_token_bitmask = timer.wrap("apply", sampler_module.apply_token_bitmask)
    try:
        yield timer
    finally:
        core.step, grammars.fill_bitmask, grammars.advance = saved[:3]
        sampler_module.apply_token_bitmask = saved[3]


def prompts_and_schemas(n: int):
    cases = [SCHEMA_CASES[i % len(SCHEMA_CASES)] for i in range(n)]
    convs = [[{"role": "user", "content": p + " Answer in JSON."}] for _, p, _ in cases]
    return convs, [schema for _, _, schema in cases]


def run(
    llm: LLM,
    convs,
    schemas,
    batch: int,
    max_tokens: list[int],
    constrained: bool,
    jump_forward: bool,
):
    """One configuration. Unconstrained runs ignore EOS, so each request produces exactly
    its max_tokens: given the constrained run's lengths, both do the same work."""
    llm.engine.config.structured.jump_forward = jump_forward
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=n,
            ignore_eos=not constrained,
            structured_outputs=StructuredOutputsParams(json=s) if constrained else None,
        )
        for s, n in zip(schemas, max_tokens)
    ]
    llm.chat(convs[:1], params[:1], use_tqdm=False)  # compile + warm up outside the clock
    forced_before = llm.engine.grammars.stats.jump_forward_tokens
    steps_before = llm.engine.scheduler.step_count
    outs = []
    with instrumented(llm) as timers:
        t0 = time.perf_counter()
        for i in range(0, len(convs), batch):  # waves of `batch` requests at once
            outs += llm.chat(convs[i : i + batch], params[i : i + batch], use_tqdm=False)
        wall = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    valid = 0
    for o in outs:
        try:
            json.loads(o.outputs[0].text)
            valid += 1
        except ValueError:
            if constrained:
                sample = o.outputs[0]
                print(f"  not JSON ({sample.finish_reason}): {sample.text!r}", flush=True)
    full = timers.summary(rows=batch) if constrained else timers.summary()
    return {
        "lengths": [len(o.outputs[0].token_ids) for o in outs],
        "requests": len(convs),
        "constrained": constrained,
        "jump_forward": jump_forward,
        "wall_s": wall,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / wall,
        "steps": llm.engine.scheduler.step_count - steps_before,
        "forced_tokens": llm.engine.grammars.stats.jump_forward_tokens - forced_before,
        "valid_json": valid,
        # Median per step over the steps where all `batch` requests sampled (constrained).
        "full_batch": full,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--min-requests", type=int, default=8, help="run at least this many (in waves)")
    ap.add_argument("--waves", type=int, default=3, help="waves of batch-size requests")
    ap.add_argument("--save-json", default=None)
    args = ap.parse_args()
    llm = LLM(args.model, dtype=args.dtype, kv_cache_memory=1 << 30)
    rows = []
    for bs in args.batch_sizes:
        convs, schemas = prompts_and_schemas(max(bs * args.waves, args.min_requests))
        limit = [args.max_tokens] * len(convs)
        lengths = None
        # json, free, json+jf, then json and free again: two ratios, to see the noise.
        for label, constrained, jf in (
            ("json", True, False),
            ("free", False, False),
            ("json+jf", True, True),
            ("json", True, False),
            ("free", False, False),
        ):
            r = run(llm, convs, schemas, bs, limit if constrained else lengths, constrained, jf)
            if label == "json" and lengths is None:
                lengths = r["lengths"]  # the free run produces exactly as many tokens
            r["batch"] = bs
            r["label"] = label
            rows.append(r)
            f = r["full_batch"]
            print(
                f"batch {bs:3d} {label:8s} {r['output_tok_s']:7.1f} out tok/s  "
                f"{r['output_tokens']:5d} tokens {r['steps']:4d} steps  forced {r['forced_tokens']:4d}"
                f"  valid {r['valid_json']}/{r['requests']}  |  full-batch steps "
                f"({f['steps_measured']}): step {f['step_ms']:.2f} ms, fill {f['fill_ms']:.3f} "
                f"apply {f['apply_ms']:.3f} advance {f['advance_ms']:.3f} = "
                f"{f['grammar_ms']:.3f} ms ({f['grammar_pct']:.1f}%)",
                flush=True,
            )
    if args.save_json:
        Path(args.save_json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
