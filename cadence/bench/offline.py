"""Offline benchmarks: `cadence bench throughput` and `cadence bench latency`.

throughput   N prompts of random token ids (or the `mixed` set) through `LLM.generate`,
             all submitted at once; reports requests/s, total tokens/s, output tokens/s.
latency      one batch, run a few times after a warm-up; times every engine step itself
             (`EngineCore.step()`), and splits the run into prefill (until every request
             has its first token) and decode (every step after that).

Workloads are plain data (`BenchRequest`: prompt ids + output length), built from a seed by
`sample_requests`, so other engines (benchmarks/hf_baseline.py) replay the very same prompts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass

from cadence.engine_args import non_negative_int, positive_int

# The `mixed` set: lengths uniform in these closed ranges.
MIXED_INPUT_RANGE = (16, 512)
MIXED_OUTPUT_RANGE = (16, 256)


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


# ---- workloads ------------------------------------------------------------------------


def _length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's random dataset: lengths uniform in [len*(1-r), len*(1+r)], at least 1."""
    low = max(1, int(length * (1 - range_ratio)))
    high = max(low, int(length * (1 + range_ratio)))
    return low, high


def sample_random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    seed: int = 0,
    range_ratio: float = 0.0,
) -> list[BenchRequest]:
    """`num_prompts` prompts of uniformly random token ids in [0, vocab_size)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"random_range_ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError("input_len and output_len must be positive")
    rng = random.Random(seed)
    in_lo, in_hi = _length_range(input_len, range_ratio)
    out_lo, out_hi = _length_range(output_len, range_ratio)
    requests = []
    for _ in range(num_prompts):
        n_in = rng.randint(in_lo, in_hi)
        n_out = rng.randint(out_lo, out_hi)
        prompt = [rng.randrange(vocab_size) for _ in range(n_in)]
        requests.append(BenchRequest(prompt, n_out))
    return requests


def sample_mixed_requests(num_prompts: int, vocab_size: int, seed: int = 0) -> list[BenchRequest]:
    """Prompts of 16-512 tokens, outputs of 16-256 tokens, both uniform (the `mixed` set)."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        n_in = rng.randint(*MIXED_INPUT_RANGE)
        n_out = rng.randint(*MIXED_OUTPUT_RANGE)
        prompt = [rng.randrange(vocab_size) for _ in range(n_in)]
        requests.append(BenchRequest(prompt, n_out))
    return requests


def sample_requests(args: argparse.Namespace, vocab_size: int) -> list[BenchRequest]:
    """The workload that `add_workload_args`' flags describe."""
    if args.dataset == "mixed":
        return sample_mixed_requests(args.num_prompts, vocab_size, args.seed)
    return sample_random_requests(
        args.num_prompts,
        args.input_len,
        args.output_len,
        vocab_size,
        args.seed,
        args.random_range_ratio,
    )


def add_workload_args(parser: argparse.ArgumentParser, seed_flag: bool = False) -> None:
    """Flags that pick the throughput workload (shared with benchmarks/hf_baseline.py).

    The seed is the engine's `--seed` for Cadence; other tools pass `seed_flag=True`.
    """
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--dataset",
        choices=("random", "mixed"),
        default="random",
        help="random: --input-len/--output-len (+ --random-range-ratio); "
        f"mixed: prompts {MIXED_INPUT_RANGE[0]}-{MIXED_INPUT_RANGE[1]} tokens, outputs "
        f"{MIXED_OUTPUT_RANGE[0]}-{MIXED_OUTPUT_RANGE[1]}, uniform (default: random)",
    )
    g.add_argument("--num-prompts", type=positive_int, default=64, help="(default: 64)")
    g.add_argument(
        "--input-len", type=positive_int, default=128, help="prompt tokens (default: 128)"
    )
    g.add_argument("--output-len", type=positive_int, default=128, help="new tokens (default: 128)")
    g.add_argument(
        "--random-range-ratio",
        type=_ratio,
        default=0.0,
        help="lengths uniform in [len*(1-r), len*(1+r)] (default: 0)",
    )
    if seed_flag:
        g.add_argument(
            "--seed", type=int, default=0, help="seed of the prompt generator (default: 0)"
        )


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


# ---- reporting ------------------------------------------------------------------------


def machine_info() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def throughput_figures(
    requests: list[BenchRequest], elapsed: float, num_output_tokens: int
) -> dict:
    """The figures both engines report, from the same definitions."""
    prompt_tokens = sum(r.prompt_len for r in requests)
    return {
        "elapsed_time": elapsed,
        "num_requests": len(requests),
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": num_output_tokens,
        "total_num_tokens": prompt_tokens + num_output_tokens,
        "requests_per_second": len(requests) / elapsed,
        "tokens_per_second": (prompt_tokens + num_output_tokens) / elapsed,
        "output_tokens_per_second": num_output_tokens / elapsed,
    }


def print_throughput(title: str, fig: dict) -> None:
    print(f"==== {title} ====")
    print(f"requests:              {fig['num_requests']}")
    print(f"prompt tokens:         {fig['total_prompt_tokens']}")
    print(f"output tokens:         {fig['total_output_tokens']}")
    print(f"elapsed:               {fig['elapsed_time']:.2f} s")
    print(
        f"Throughput: {fig['requests_per_second']:.2f} requests/s, "
        f"{fig['tokens_per_second']:.2f} total tokens/s, "
        f"{fig['output_tokens_per_second']:.2f} output tokens/s"
    )


def write_json(path: str, result: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# ---- throughput -----------------------------------------------------------------------


def add_throughput_args(parser: argparse.ArgumentParser) -> None:
    add_workload_args(parser)
    g = parser.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="(default: 1)")
    g.add_argument("--top-k", type=int, default=0, help="0: off (default: 0)")
    g = parser.add_argument_group("run")
    g.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run one short request before timing (default: on)",
    )
    g.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="show a progress bar (default: off)",
    )


def _sampling_params(args: argparse.Namespace, output_len: int):
    from cadence.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=output_len,
        ignore_eos=True,
    )


def warm_up(llm) -> None:
    """One short request, so first-call costs (allocator, kernels) are not timed."""
    from cadence.sampling_params import SamplingParams

    llm.generate(
        [{"prompt_token_ids": list(range(1, 17))}],
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
        use_tqdm=False,
    )


def run_throughput(args: argparse.Namespace, engine_kwargs: dict) -> dict:
    from cadence.llm import LLM

    llm = LLM(**engine_kwargs)
    requests = sample_requests(args, llm.engine.vocab_size)
    too_long = [r for r in requests if r.prompt_len + r.output_len > llm.engine.max_model_len]
    if too_long:
        raise SystemExit(
            f"error: {len(too_long)} requests need more than max_model_len "
            f"({llm.engine.max_model_len}) tokens; shorten --input-len/--output-len"
        )
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [_sampling_params(args, r.output_len) for r in requests]
    if args.warmup:
        warm_up(llm)

    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=args.progress)
    elapsed = time.perf_counter() - start

    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    wanted = sum(r.output_len for r in requests)
    if num_out != wanted:
        print(
            f"warning: {num_out} output tokens generated, {wanted} requested",
            file=sys.stderr,
        )
    fig = throughput_figures(requests, elapsed, num_out)
    stats = llm.engine.stats()
    result = {
        "benchmark": "throughput",
        "engine": "cadence",
        "date": _now(),
        "machine": machine_info(),
        "model": llm.engine.runner.model_path,
        "dtype": str(llm.engine.runner.driver.dtype).removeprefix("torch."),
        "device": str(llm.engine.runner.driver.device),
        "engine_args": {k: v for k, v in engine_kwargs.items()},
        "workload": _workload_desc(args),
        "num_preemptions": stats.num_preemptions,
        **fig,
    }
    print_throughput("Cadence offline throughput", fig)
    if stats.num_preemptions:
        print(f"preemptions:           {stats.num_preemptions}")
    if args.json:
        write_json(args.json, result)
    return result


def _workload_desc(args: argparse.Namespace) -> dict:
    desc = {"dataset": args.dataset, "num_prompts": args.num_prompts, "seed": args.seed}
    if args.dataset == "random":
        desc.update(
            input_len=args.input_len,
            output_len=args.output_len,
            random_range_ratio=args.random_range_ratio,
        )
    else:
        desc.update(input_range=MIXED_INPUT_RANGE, output_range=MIXED_OUTPUT_RANGE)
    return desc


# ---- latency --------------------------------------------------------------------------


def add_latency_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--batch-size", type=positive_int, default=8, help="(default: 8)")
    g.add_argument("--input-len", type=positive_int, default=32, help="prompt tokens (default: 32)")
    g.add_argument("--output-len", type=positive_int, default=128, help="new tokens (default: 128)")
    g = parser.add_argument_group("run")
    g.add_argument(
        "--num-iters-warmup",
        type=non_negative_int,
        default=1,
        help="untimed runs first (default: 1)",
    )
    g.add_argument("--num-iters", type=positive_int, default=3, help="timed runs (default: 3)")
    g.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")


@dataclass
class LatencyRun:
    total: float  # seconds, add_request to the last step
    prefill: float  # until every request has its first token
    decode_steps: list[float]  # seconds of each step after that

    @property
    def decode(self) -> float:
        return sum(self.decode_steps)


def _one_batch(engine, prompts: list[list[int]], output_len: int, tag: str) -> LatencyRun:
    """Add a batch and step the engine until it is idle; time each step."""
    from cadence.sampling_params import SamplingParams

    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        engine.add_request(f"{tag}-{i}", ids, params)
    pending_first = {f"{tag}-{i}" for i in range(len(prompts))}
    prefill_end = None
    decode_steps: list[float] = []
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        updates = engine.step()
        s1 = time.perf_counter()
        if prefill_end is None:
            # a request's first update carries its first token
            pending_first.difference_update(u.request_id for u in updates)
            if not pending_first:
                prefill_end = s1
        else:
            decode_steps.append(s1 - s0)
    end = time.perf_counter()
    return LatencyRun(end - t0, (prefill_end or end) - t0, decode_steps)


def run_latency(args: argparse.Namespace, engine_kwargs: dict) -> dict:
    from cadence.llm import LLM

    llm = LLM(**engine_kwargs)
    engine = llm.engine
    if args.input_len + args.output_len > engine.max_model_len:
        raise SystemExit(
            f"error: --input-len + --output-len ({args.input_len + args.output_len}) exceeds "
            f"max_model_len ({engine.max_model_len})"
        )
    rng = random.Random(engine.config.model.seed)
    runs: list[LatencyRun] = []
    for it in range(args.num_iters_warmup + args.num_iters):
        # Fresh random prompts each run, so the prefix cache cannot serve a repeat.
        prompts = [
            [rng.randrange(engine.vocab_size) for _ in range(args.input_len)]
            for _ in range(args.batch_size)
        ]
        run = _one_batch(engine, prompts, args.output_len, f"lat{it}")
        if it >= args.num_iters_warmup:
            runs.append(run)
        kind = "warm-up" if it < args.num_iters_warmup else "run"
        print(
            f"{kind} {it + 1}: {run.total * 1e3:.1f} ms "
            f"(prefill {run.prefill * 1e3:.1f} ms, decode {run.decode * 1e3:.1f} ms)",
            file=sys.stderr,
        )

    totals = [r.total for r in runs]
    prefills = [r.prefill for r in runs]
    steps = [s for r in runs for s in r.decode_steps]
    decode_time = sum(r.decode for r in runs)
    decode_tokens = sum(len(r.decode_steps) for r in runs) * args.batch_size
    result = {
        "benchmark": "latency",
        "engine": "cadence",
        "date": _now(),
        "machine": machine_info(),
        "model": engine.runner.model_path,
        "dtype": str(engine.runner.driver.dtype).removeprefix("torch."),
        "device": str(engine.runner.driver.device),
        "engine_args": dict(engine_kwargs),
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_iters": args.num_iters,
        "avg_latency": statistics.mean(totals),
        "latencies": totals,
        "percentiles": {str(p): _percentile(totals, p) for p in (10, 25, 50, 75, 90, 99)},
        "avg_prefill_time": statistics.mean(prefills),
        "avg_decode_step_time": statistics.mean(steps) if steps else None,
        "median_decode_step_time": statistics.median(steps) if steps else None,
        "decode_tokens_per_second": decode_tokens / decode_time if decode_time else None,
        "prefill_tokens_per_second": args.batch_size * args.input_len / statistics.mean(prefills),
    }
    print("==== Cadence latency ====")
    print(
        f"batch {args.batch_size}, {args.input_len} prompt tokens, {args.output_len} new "
        f"tokens, {args.num_iters} runs"
    )
    print(f"avg latency:           {result['avg_latency'] * 1e3:.1f} ms")
    for p in (50, 90, 99):
        print(f"p{p} latency:           {result['percentiles'][str(p)] * 1e3:.1f} ms")
    print(
        f"prefill:               {result['avg_prefill_time'] * 1e3:.1f} ms "
        f"({result['prefill_tokens_per_second']:.1f} tokens/s)"
    )
    if steps:
        print(
            f"decode step:           {result['avg_decode_step_time'] * 1e3:.2f} ms mean, "
            f"{result['median_decode_step_time'] * 1e3:.2f} ms median"
        )
        print(f"decode:                {result['decode_tokens_per_second']:.1f} tokens/s")
    if args.json:
        write_json(args.json, result)
    return result


def _percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


__all__ = [
    "BenchRequest",
    "MIXED_INPUT_RANGE",
    "MIXED_OUTPUT_RANGE",
    "add_latency_args",
    "add_throughput_args",
    "add_workload_args",
    "machine_info",
    "print_throughput",
    "run_latency",
    "run_throughput",
    "sample_mixed_requests",
    "sample_random_requests",
    "sample_requests",
    "throughput_figures",
    "write_json",
]
