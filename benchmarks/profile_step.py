"""Where a step's time goes, on the GPU (issue 4's profile).

    python benchmarks/profile_step.py benchmarks/llama-3.1-8b --batch-size 64 [--async-scheduling]

Two views of the same workload (a batch of random prompts, greedy, EOS ignored):

host     per decode step, the host time of each phase of `EngineCore.step()` (schedule,
         execute_model = prepare + launch, sample launch, resolve = wait for the ids, update),
         medians over the decode steps. Without async scheduling the wait for the GPU sits
         in `resolve`; with it, the wait overlaps the next step's preparation.
kernels  torch.profiler over a few decode steps, and over one prefill step of
         --prefill-tokens tokens: GPU time per kernel class, per step, set against the
         bytes (decode: weights + KV read) and FLOPs (prefill: 2 x linear params x tokens)
         the step must move, with the HBM bandwidth given by --hbm-gbps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

PHASES = ("schedule", "execute_model", "sample_async", "resolve", "update")


def classify(name: str) -> str:
    n = name.lower()
    if "nccl" in n or "all_reduce" in n or "allreduce" in n or "symm" in n:
        return "all-reduce / gather"
    # (the last: torch's grouped GEMM, CUTLASS's kernel over a GroupProblemShape)
    moe = ("grouped_gemm", "align_kernel", "topk_softmax", "_count_kernel", "_label_runs",
           "_scatter_kernel", "_pairs_", "sum_slots", "_group_ends", "_scatter_rows",
           "groupproblemshape")  # fmt: skip
    if any(m in n for m in moe):
        return "moe (route, align, grouped gemms / gemvs, slot sum)"
    if "attention" in n or "split_kv" in n:
        return "attention"
    if "write_kv" in n:
        return "rotary + kv write"
    if "gemv" in n:
        return "gemv (+ norm / silu*mul)"
    if "gemm" in n or "cutlass" in n or "nvjet" in n or "sm90_" in n or "cublas" in n:
        return "gemm"
    if "rms_norm" in n:
        return "rms norm"
    if "rotary" in n:
        return "rotary"
    if "silu" in n:
        return "silu*mul"
    if "argmax" in n or "sort" in n or "softmax" in n or "reduce" in n:
        return "sampler/reduce"
    if "memcpy" in n or "memset" in n:
        return "copies"
    return "other"


def instrument(engine) -> dict[str, list[float]]:
    """Time each phase of every step (host perf_counter), by wrapping the bound methods."""
    times: dict[str, list[float]] = defaultdict(list)
    owners = {
        "schedule": engine.scheduler,
        "update": engine.scheduler,
        "execute_model": engine.runner,
        "sample_async": engine.runner,
        "resolve": engine.runner,
    }
    for name, owner in owners.items():
        fn = getattr(owner, name)

        def timed(*a, _fn=fn, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                times[_name].append(time.perf_counter() - t0)

        setattr(owner, name, timed)
    return times


def watch_syncs() -> list[str]:
    """Every synchronising CUDA call (torch's sync debug mode), with where it came from."""
    import traceback
    import warnings

    seen: list[str] = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            frames = [f for f in traceback.extract_stack() if "cadence" in f.filename]
            where = " <- ".join(
                f"{f.filename.split('cadence/')[-1]}:{f.lineno}" for f in frames[::-1][:4]
            )
            if where not in seen:
                seen.append(where)

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    return seen


def add_batch(engine, tag: str, batch: int, input_len: int, output_len: int, seed: int) -> None:
    from cadence.sampling_params import SamplingParams

    g = torch.Generator().manual_seed(seed)
    for i in range(batch):
        ids = torch.randint(0, engine.vocab_size, (input_len,), generator=g).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        engine.add_request(f"{tag}-{i}", ids, params)


def _kernels(prof):
    """(name, device microseconds, calls) of every GPU-side event (kernels, copies)."""
    for evt in prof.key_averages():
        if evt.device_type.name != "CUDA":
            continue  # CPU ops: their kernels are listed on their own
        us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
        if us:
            yield evt.key, us, evt.count


def kernel_table(prof, steps: int) -> dict[str, float]:
    """GPU microseconds per step, by kernel class."""
    per_class: dict[str, float] = defaultdict(float)
    for name, us, _ in _kernels(prof):
        per_class[classify(name)] += us / steps
    return dict(sorted(per_class.items(), key=lambda kv: -kv[1]))


def top_kernels(prof, steps: int, k: int = 12) -> list[tuple[str, float, int]]:
    rows = [(name[:90], us / steps, count // max(steps, 1)) for name, us, count in _kernels(prof)]
    return sorted(rows, key=lambda r: -r[1])[:k]


def print_step_kernels(table: dict[str, float], prof) -> None:
    """One profiled step: GPU time per kernel class, then its top kernels."""
    for k, v in table.items():
        print(f"  {k:16s} {v / 1e3:8.2f} ms")
    for name, us, count in top_kernels(prof, 1):
        print(f"    {us / 1e3:8.2f} ms x{count:<4d} {name}")


def write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def profile_steps(engine, steps: int):
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        wall = (time.perf_counter() - t0) / steps
    return prof, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=8192)
    ap.add_argument("--prefill-prompt-len", type=int, default=1024)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--sync-debug", action="store_true", help="list synchronising CUDA calls")
    ap.add_argument("--mixed-step", type=int, default=0, help="also profile this step of a batch")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="measured HBM read GB/s")
    ap.add_argument("--async-scheduling", action="store_true")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, help="rank 0's view")
    ap.add_argument("--quantization", default="auto", help="e.g. fp8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from cadence.llm import LLM

    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        async_scheduling=args.async_scheduling,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        quantization=args.quantization,
    )
    engine = llm.engine
    model = engine.runner.driver.model
    params = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    embed = sum(v for n, v in params.items() if "embed_tokens" in n)
    tied = not any("lm_head" in n for n in params)
    weight_bytes = sum(params.values()) - (0 if tied else embed)
    linear_params = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
    )
    if tied:
        linear_params += embed // 2
    result: dict = {"args": vars(args), "weight_bytes": weight_bytes}

    # warm-up: one full batch
    add_batch(engine, "warm", args.batch_size, args.input_len, 16, 0)
    while engine.has_unfinished_requests():
        engine.step()

    # the whole batch, step by step: prefill-carrying steps apart from decode-only ones
    times = instrument(engine)
    cuda = torch.cuda.is_available()
    syncs = watch_syncs() if cuda and args.sync_debug else []
    scheduled: list = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: scheduled.append(schedule()) or scheduled[-1]
    add_batch(engine, "host", args.batch_size, args.input_len, args.output_len, 1)
    t_start = time.perf_counter()
    walls, kinds = [], []
    while engine.has_unfinished_requests():
        n = len(scheduled)
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
        s_out = scheduled[-1] if len(scheduled) > n else None
        mixed = s_out is not None and s_out.total_num_scheduled_tokens > len(
            s_out.num_scheduled_tokens
        )
        kinds.append("prefill" if mixed else "decode")
    total = time.perf_counter() - t_start
    if syncs:
        torch.cuda.set_sync_debug_mode(0)
        print(f"== synchronising CUDA calls during the batch: {len(syncs)} call sites")
        for where in syncs:
            print(f"  {where}")
    run = {}
    for kind in ("prefill", "decode"):
        w = [x for x, k in zip(walls, kinds) if k == kind]
        run[kind] = {"steps": len(w), "seconds": sum(w)}
    run["total_s"] = total
    result["run"] = run
    print(
        f"== batch of {args.batch_size} x {args.input_len} -> {args.output_len}: {total:.2f} s; "
        f"{run['prefill']['steps']} steps with prefill tokens {run['prefill']['seconds']:.2f} s, "
        f"{run['decode']['steps']} decode-only steps {run['decode']['seconds']:.2f} s"
    )
    decode_idx = [i for i, k in enumerate(kinds) if k == "decode"]
    host = {}
    for k in PHASES:
        # phase i belongs to step i (every step calls each phase at most once)
        vals = [times[k][i] for i in decode_idx if i < len(times[k])]
        if vals:
            host[k] = statistics.median(vals) * 1e3
    host["step wall"] = statistics.median([walls[i] for i in decode_idx]) * 1e3
    result["host_ms"] = host
    print(f"== host time per decode-only step, batch {args.batch_size} (median ms)")
    for k, v in host.items():
        print(f"  {k:14s} {v:7.3f}")
    engine.scheduler.schedule = schedule

    # kernels over decode steps, mid-run
    add_batch(engine, "prof", args.batch_size, args.input_len, 64, 2)
    sched = engine.scheduler
    prefilling = 1
    while prefilling:  # until every request decodes, then a few steps more
        engine.step()
        prefilling = len(sched.waiting) + sum(
            r.num_computed_tokens < r.num_prompt_tokens for r in sched.running
        )
    for _ in range(4):
        engine.step()
    prof, wall = profile_steps(engine, args.profile_steps)
    ctx = args.input_len + 5 + args.profile_steps // 2
    kv_bytes = (
        args.batch_size
        * ctx
        * engine.runner.driver._kv_bytes_per_block()
        / engine.runner.driver.block_size
    )
    table = kernel_table(prof, args.profile_steps)
    gpu = sum(table.values())
    result["decode"] = {"wall_ms": wall * 1e3, "gpu_us": table, "kv_bytes": kv_bytes}
    print(
        f"== decode step, batch {args.batch_size}, ~{ctx} tokens of context: "
        f"wall {wall * 1e3:.3f} ms, GPU {gpu / 1e3:.3f} ms"
    )
    for k, v in table.items():
        print(f"  {k:16s} {v / 1e3:7.3f} ms")
    if args.hbm_gbps:
        floor = (weight_bytes + kv_bytes) / (args.hbm_gbps * 1e9) * 1e3
        gemm = table.get("gemm", 0) / 1e3
        print(
            f"  bytes {(weight_bytes + kv_bytes) / 1e9:.2f} GB -> floor {floor:.3f} ms; "
            f"step at {floor / (wall * 1e3):.0%} of it; gemm kernels move weights at "
            f"{weight_bytes / (gemm / 1e3) / 1e9 if gemm else 0:.0f} GB/s"
        )
        result["decode"]["floor_ms"] = floor
    for name, us, count in top_kernels(prof, args.profile_steps):
        print(f"    {us / 1e3:7.3f} ms x{count:<4d} {name}")
    while engine.has_unfinished_requests():
        engine.step()

    # one mixed step: prefill chunks of a fresh batch plus the decodes of its earlier part
    if args.mixed_step:
        add_batch(engine, "mixed", args.batch_size, args.input_len, 8, 4)
        for _ in range(args.mixed_step):
            engine.step()
        num_decodes = sum(
            r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running
        )
        prof, wall = profile_steps(engine, 1)
        while engine.has_unfinished_requests():
            engine.step()
        table = kernel_table(prof, 1)
        result["mixed"] = {"wall_ms": wall * 1e3, "gpu_us": table, "decodes": num_decodes}
        print(
            f"== mixed step {args.mixed_step} of a batch of {args.batch_size} x "
            f"{args.input_len}: ~{num_decodes} decodes + prefill chunks, wall "
            f"{wall * 1e3:.1f} ms, GPU {sum(table.values()) / 1e3:.1f} ms"
        )
        print_step_kernels(table, prof)

    # one prefill step of --prefill-tokens tokens
    if not args.prefill_tokens:
        write_json(args.json, result)
        return
    n = max(1, args.prefill_tokens // args.prefill_prompt_len)
    add_batch(engine, "pre", n, args.prefill_prompt_len, 1, 3)
    prof, wall = profile_steps(engine, 1)
    while engine.has_unfinished_requests():
        engine.step()
    table = kernel_table(prof, 1)
    tokens = n * args.prefill_prompt_len
    flops = 2 * linear_params * tokens
    gemm = table.get("gemm", 0) / 1e6
    result["prefill"] = {"tokens": tokens, "wall_ms": wall * 1e3, "gpu_us": table}
    print(
        f"== prefill step, {n} x {args.prefill_prompt_len} tokens: wall {wall * 1e3:.1f} ms, "
        f"GPU {sum(table.values()) / 1e3:.1f} ms; linear layers {flops / 1e12:.0f} TFLOP -> "
        f"gemm kernels at {flops / gemm / 1e12 if gemm else 0:.0f} TFLOP/s"
    )
    print_step_kernels(table, prof)
    write_json(args.json, result)
    llm.shutdown()


if __name__ == "__main__":
    main()
