"""`cadence bench serve`: an async streaming client that benchmarks a running
OpenAI-compatible server (Cadence's or any other).

    cadence bench serve --base-url http://127.0.0.1:8000 --dataset-name random \\
        --random-input-len 512 --random-output-len 128 --num-prompts 200 \\
        --max-concurrency 16 --ignore-eos --save-json out.json

Each request streams (`stream_options.include_usage`), and is timed on this side: TTFT
from send to the first chunk carrying text, each gap between text chunks (ITL), send to
the end of the stream (end-to-end). Token counts come from the server's usage chunk and
are cross-checked with `--tokenizer`. `--sweep 1,4,16` repeats the run at several
concurrencies (fresh prompts each time: seed + run index). Flags follow `vllm bench serve`
where the meaning is the same. See cadence/bench/stats.py for the figures' definitions.

A soak (`--duration`, `--hangup-fraction`, `--invalid-fraction`, `--server-pid`) adds a
`/health` prober and, with a pid, the server's RSS; its counts go in each run's "soak":

    cadence bench serve --max-concurrency 64 --duration 600 --hangup-fraction 0.1 \\
        --invalid-fraction 0.05 --server-pid $(pgrep -f cadence::api)

The parts: serve_args.py (flags), serve_client.py (talking to the server), serve_load.py
(the load loop), soak.py (hang-ups, invalid bodies, /health, RSS); this file puts a run
together and reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import shlex
import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from cadence.bench import report, spec_metrics
from cadence.bench.datasets import (
    BenchPrompt,
    add_random_images,
    count_prompt_tokens,
    count_text_tokens,
    load_jsonl,
    random_prompts,
    shared_prefix_prompts,
)
from cadence.bench.serve_args import (
    DEFAULT_NUM_PROMPTS,
    BenchError,
    add_bench_serve_args,
    check_bench_serve_args,
)
from cadence.bench.serve_client import (
    ServerInfo,
    base_url,
    error_kind,
    make_client,
    request_body,
    send_request,
    server_info,
)
from cadence.bench.serve_load import LoadPlan, arrival_delays, run_requests
from cadence.bench.soak import HealthProber, RssSampler, format_soak
from cadence.bench.stats import RequestRecord, summarize, token_check

if TYPE_CHECKING:
    import httpx


# ---- prompts and tokens ---------------------------------------------------------------


def load_bench_tokenizer(args: argparse.Namespace, info: ServerInfo) -> tuple[Any, str | None]:
    """The tokenizer and its folder; (None, None) for `--tokenizer none`."""
    from cadence.tokenizer import load_tokenizer

    path = args.tokenizer
    if path is not None and path.lower() == "none":
        if args.dataset_name != "jsonl":
            raise BenchError(f"--dataset-name {args.dataset_name} needs a tokenizer")
        return None, None
    root = info.model_root
    if path is None and root and os.path.isdir(root):
        tokenizer = load_tokenizer(root)
        if tokenizer is not None:
            return tokenizer, root
    if path is None:
        from cadence.loader.model_path import resolve_model_path

        try:
            path = resolve_model_path(None)
        except (FileNotFoundError, ValueError) as e:
            if args.dataset_name != "jsonl":
                raise BenchError(f"no default tokenizer ({e}); give --tokenizer") from None
            return None, None
    if not os.path.isdir(path):
        raise BenchError(f"--tokenizer {path!r} is not a folder")
    tokenizer = load_tokenizer(path)
    if tokenizer is None:
        raise BenchError(f"--tokenizer {path!r} holds no tokenizer")
    return tokenizer, path


def build_prompts(
    args: argparse.Namespace, tokenizer, chat: bool, seed: int, num: int | None = None
) -> list[BenchPrompt]:
    """The dataset's prompts for one run (`num` of them: default --num-prompts), each
    with the tokenizer's count of its prompt tokens."""
    n = num or args.num_prompts
    name = args.dataset_name
    if name == "jsonl":
        prompts = load_jsonl(args.dataset_path, args.num_prompts, args.custom_output_len, chat)
        prompts = prompts[:n] if n else prompts
    elif name == "random":
        prompts = random_prompts(
            tokenizer,
            n or DEFAULT_NUM_PROMPTS,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            seed,
        )
        if args.random_images:  # (chat only: check_bench_serve_args)
            add_random_images(prompts, args.random_images, args.random_image_size, seed)
    else:
        groups = args.prefix_repetition_num_prefixes
        total = args.num_prompts or DEFAULT_NUM_PROMPTS
        prompts = shared_prefix_prompts(
            tokenizer,
            groups,
            total // groups,
            args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len,
            args.prefix_repetition_output_len,
            seed,
            chat,
        )[: n or total]
    for p in prompts:
        p.expected_prompt_tokens = count_prompt_tokens(tokenizer, p, chat)
    return prompts


def fill_token_counts(records: list[RequestRecord], tokenizer) -> None:
    """After a run: the tokenizer's count of each output; where the server sent no usage,
    the tokenizer's counts stand in."""
    for r in records:
        if not r.success:
            continue
        r.tokenizer_output_tokens = count_text_tokens(tokenizer, r.generated_text)
        if r.usage_source is None and tokenizer is not None:
            r.prompt_tokens = r.tokenizer_prompt_tokens
            r.output_tokens = r.tokenizer_output_tokens
            r.usage_source = "tokenizer"


def describe_dataset(args: argparse.Namespace) -> dict[str, Any]:
    d: dict[str, Any] = {"name": args.dataset_name}
    if args.dataset_name == "random":
        d.update(
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
        )
        if args.random_images:
            d.update(images=args.random_images, image_size=list(args.random_image_size))
    elif args.dataset_name == "shared-prefix":
        d.update(
            num_prefixes=args.prefix_repetition_num_prefixes,
            prefix_len=args.prefix_repetition_prefix_len,
            suffix_len=args.prefix_repetition_suffix_len,
            output_len=args.prefix_repetition_output_len,
        )
    else:
        d.update(path=os.path.abspath(args.dataset_path), default_max_tokens=args.custom_output_len)
    return d


# ---- context of the result ------------------------------------------------------------


def git_commit() -> tuple[str | None, bool | None]:
    """The commit of the Cadence checkout this runs from, and whether it has edits."""
    import cadence

    root = os.path.dirname(os.path.dirname(os.path.abspath(cadence.__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def result_path(args: argparse.Namespace, concurrencies: list[int | None]) -> str | None:
    """Where the JSON goes: --save-json, or --save-result's folder and name."""
    if args.save_json:
        return args.save_json
    if not args.save_result:
        return None
    name = args.result_filename
    if name is None:
        conc = "-".join("inf" if c is None else str(c) for c in concurrencies)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = f"cadence-serve-{args.endpoint}-{args.dataset_name}-c{conc}-{stamp}.json"
    return os.path.join(args.result_dir or ".", name)


# ---- the benchmark --------------------------------------------------------------------


async def _warm_up(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    info: ServerInfo,
    tokenizer,
    chat: bool,
    seed: int,
) -> dict[str, Any]:
    """Untimed requests (counted, so a server's counters can be reconciled); the first
    failure stops the benchmark with its message."""
    n = args.num_warmups
    if n == 0:
        return {"requests": 0, "completed": 0, "prompt_tokens": 0, "output_tokens": 0, "ttft_s": []}
    prompts = build_prompts(args, tokenizer, chat, seed, num=n)
    if len(prompts) < n:  # a short JSONL file: repeat it
        prompts = [prompts[i % len(prompts)] for i in range(n)]
    bodies = [request_body(p, info.model, chat, args) for p in prompts]
    conc = min(n, args.max_concurrency or (args.sweep or [n])[0])
    plan = LoadPlan(chat, info.model, conc, [0.0] * n)
    records, _, _ = await run_requests(client, prompts, bodies, plan, False, "warm-up")
    failed = [r for r in records if not r.success]
    if failed:
        raise BenchError(f"warm-up request failed: {failed[0].error}")
    fill_token_counts(records, tokenizer)
    return {
        "requests": n,
        "completed": n,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in records),
        "output_tokens": sum(r.output_tokens or 0 for r in records),
        "ttft_s": [r.ttft for r in records],
    }


async def _one_run(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    info: ServerInfo,
    tokenizer,
    chat: bool,
    concurrency: int | None,
    seed: int,
) -> dict[str, Any]:
    prompts = build_prompts(args, tokenizer, chat, seed)
    bodies = [request_body(p, info.model, chat, args) for p in prompts]
    delays = arrival_delays(len(prompts), args.request_rate, args.burstiness, seed)
    desc = f"concurrency {concurrency or 'unlimited'}"
    plan = LoadPlan(
        chat,
        info.model,
        concurrency,
        delays,
        args.duration,
        args.hangup_fraction,
        args.invalid_fraction,
        seed,
    )
    stop = asyncio.Event()
    watchers = []
    prober = rss = None
    if is_soak(args):
        prober = HealthProber(base_url(args), args.health_interval)
        watchers.append(asyncio.create_task(prober.run(stop)))
        if args.server_pid is not None:
            rss = RssSampler(args.server_pid, args.rss_interval)
            watchers.append(asyncio.create_task(rss.run(stop)))
    spec_before = await spec_metrics.scrape(client)
    try:
        records, duration, tally = await run_requests(
            client, prompts, bodies, plan, not args.disable_tqdm, desc
        )
    finally:
        stop.set()
        await asyncio.gather(*watchers, return_exceptions=True)
    spec = spec_metrics.run_delta(spec_before, await spec_metrics.scrape(client))
    fill_token_counts(records, tokenizer)
    run: dict[str, Any] = {
        "max_concurrency": concurrency,
        "request_rate": _rate_json(args.request_rate),
        "burstiness": args.burstiness,
        "seed": seed,
        "summary": summarize(records, duration, args.slo),
        "token_check": token_check(records, args.ignore_eos),
        "requests": [r.to_json() for r in records],
    }
    if spec is not None:
        run["spec_decode"] = spec
    if prober is not None:
        errors = Counter(error_kind(r.error) for r in records if not r.success)
        errors.update(tally.errors)
        run["soak"] = {
            "duration_s": duration,
            "completed": run["summary"]["completed"],
            "failed": run["summary"]["failed"],
            "tally": tally.to_json(),
            "errors_by_kind": dict(errors.most_common()),
            "health": prober.summary(),
            "rss": rss.summary() if rss is not None else None,
        }
    return run


def is_soak(args: argparse.Namespace) -> bool:
    """Whether any soak flag is on (then /health is probed and the soak block reported)."""
    return bool(
        args.duration is not None
        or args.hangup_fraction
        or args.invalid_fraction
        or args.server_pid is not None
    )


def _rate_json(rate: float) -> float | None:
    """JSON has no infinity: an unlimited request rate is null."""
    return None if math.isinf(rate) else rate


def _print_run(run: dict[str, Any]) -> None:
    print(report.format_run(run))
    if "soak" in run:
        print(format_soak(run["soak"]))
    c = run["token_check"]
    failed = [r for r in run["requests"] if not r["success"]]
    if failed:
        print(
            f"warning: {len(failed)} requests failed; the first: {failed[0]['error']}",
            file=sys.stderr,
        )
    if c["requests_without_usage"]:
        print(
            f"warning: {c['requests_without_usage']} responses had no usage; "
            "their token counts are the tokenizer's",
            file=sys.stderr,
        )
    if c["checked_requests"]:
        print(
            f"token counts, server vs tokenizer: prompt {c['prompt_tokens_server']} vs "
            f"{c['prompt_tokens_tokenizer']}, output {c['output_tokens_server']} vs "
            f"{c['output_tokens_tokenizer']} (output text re-encoded)",
            file=sys.stderr,
        )
    if c["prompt_mismatches"]:
        print(
            f"warning: the server's prompt token count differs from the tokenizer's in "
            f"{c['prompt_mismatches']} of {c['checked_requests']} requests "
            "(another tokenizer or chat template?)",
            file=sys.stderr,
        )
    if c.get("short_outputs"):
        print(
            f"warning: with --ignore-eos, {c['short_outputs']} requests generated fewer or "
            "more tokens than max_tokens",
            file=sys.stderr,
        )


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, run once per concurrency, and return the whole result."""
    chat = args.endpoint == "chat"
    concurrencies: list[int | None] = list(args.sweep or [args.max_concurrency])
    async with make_client(args) as client:
        info = await server_info(client, args)
        tokenizer, tokenizer_path = load_bench_tokenizer(args, info)
        warmup = await _warm_up(client, args, info, tokenizer, chat, args.seed + len(concurrencies))
        runs = []
        for i, c in enumerate(concurrencies):
            run = await _one_run(client, args, info, tokenizer, chat, c, args.seed + i)
            _print_run(run)
            runs.append(run)
    commit, dirty = git_commit()
    import cadence

    return {
        "benchmark": "serve",
        "date": _now(),
        "command": shlex.join(["cadence", *getattr(args, "argv", sys.argv[1:])]),
        "git_commit": commit,
        "git_dirty": dirty,
        "cadence_version": cadence.__version__,
        "server_version": info.version,
        "base_url": info.base_url,
        "endpoint": args.endpoint,
        "model": info.model,
        "tokenizer": tokenizer_path,
        "label": args.label,
        "dataset": describe_dataset(args),
        "config": {
            "num_prompts": len(runs[0]["requests"]),
            "concurrencies": concurrencies,
            "request_rate": _rate_json(args.request_rate),
            "burstiness": args.burstiness,
            "ignore_eos": args.ignore_eos,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "extra_body": args.extra_body,
            "seed": args.seed,
            "slo_ms": args.slo,
            "num_warmups": args.num_warmups,
            "duration_s": args.duration,
            "hangup_fraction": args.hangup_fraction,
            "invalid_fraction": args.invalid_fraction,
            "server_pid": args.server_pid,
        },
        "warmup": warmup,
        "runs": runs,
    }


def run_bench_serve(args: argparse.Namespace) -> int:
    """The command: 0 if any request succeeded, 1 if none did."""
    result = asyncio.run(bench(args))
    runs = result["runs"]
    if len(runs) > 1:
        print(report.format_sweep(runs))
    path = result_path(args, result["config"]["concurrencies"])
    if path:
        report.save_json(path, result)
    if args.scoreboard:
        report.append_scoreboard(args.scoreboard, result, args.label or result["model"])
        print(f"appended {len(runs)} row(s) to {args.scoreboard}", file=sys.stderr)
    if args.plot:
        report.plot(args.plot, result)
        print(f"wrote {args.plot}", file=sys.stderr)
    if not any(r["summary"]["completed"] or _only_soak_kinds(r) for r in runs):
        print("cadence: error: every request failed", file=sys.stderr)
        return 1
    return 0


def _only_soak_kinds(run: dict[str, Any]) -> bool:
    """A run of hang-ups and invalid bodies only, with at least one answered as it should."""
    soak = run.get("soak")
    if soak is None or soak["tally"]["sent"].get("normal"):
        return False
    return bool(soak["tally"]["hangups"] or soak["tally"]["invalid_ok"])


__all__ = [
    "BenchError",
    "BenchPrompt",
    "RequestRecord",
    "ServerInfo",
    "add_bench_serve_args",
    "arrival_delays",
    "bench",
    "build_prompts",
    "check_bench_serve_args",
    "is_soak",
    "request_body",
    "run_bench_serve",
    "send_request",
]
