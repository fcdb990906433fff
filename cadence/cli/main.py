"""The `cadence` command.

    cadence generate "prompt" [--max-tokens N] [--temperature T] [--chat] [engine flags]
    cadence bench throughput [MODEL] [--dataset random|mixed] [...] [engine flags]
    cadence bench latency    [MODEL] [--batch-size B] [...] [engine flags]
    cadence bench serve      [--base-url URL] [--endpoint completions|chat] [...]
    cadence serve [MODEL] [--data-parallel-size N] [...]
    cadence router --worker URL [--worker URL ...] [--policy cache-aware]

Engine flags (--dtype, --max-num-batched-tokens, ...) come from cadence/engine_args.py, which
generates them from the configuration dataclasses; `cadence <command> --help` lists them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from cadence.engine_args import add_engine_args, check_engine_args, positive_int

_LOG_LEVELS = ("debug", "info", "warning", "error")


def _add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        choices=_LOG_LEVELS,
        default=default,
        help=f"engine log messages (on stderr) at this level and above (default: {default})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadence",
        description="Cadence: an LLM inference engine.",
    )
    from cadence import __version__

    parser.add_argument("--version", action="version", version=f"cadence {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # cadence generate
    gen = commands.add_parser(
        "generate",
        usage="cadence generate PROMPT [--max-tokens N] [--temperature T] [--chat] [options]",
        help="complete one prompt and print the text",
        description="Complete one prompt with the model (default: SmolLM2-135M-Instruct) "
        "and print the completion on stdout.",
    )
    gen.add_argument("prompt", help="the prompt text")
    g = gen.add_argument_group("generation")
    g.add_argument(
        "--max-tokens", type=positive_int, default=64, help="new tokens at most (default: 64)"
    )
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="(default: 1)")
    g.add_argument("--top-k", type=int, default=0, help="0: off (default: 0)")
    g.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's draws")
    g.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as a user message in the model's chat template",
    )
    g.add_argument("--system", default=None, help="a system message (with --chat)")
    _add_log_level(gen, "warning")
    add_engine_args(gen, positional_model=False)
    gen.set_defaults(func=_cmd_generate, parser=gen)

    # cadence serve
    from cadence.cli.serve import add_serve_args

    serve = commands.add_parser(
        "serve",
        usage="cadence serve [MODEL] [--host H] [--port P] [--api-key K] [options]",
        help="the OpenAI-compatible server",
        description="Serve a model (default: SmolLM2-135M-Instruct) over an OpenAI-compatible "
        "HTTP API: an API server process and an engine core process.",
    )
    add_serve_args(serve)
    _add_log_level(serve, "info")
    add_engine_args(serve)
    serve.set_defaults(func=_cmd_serve, parser=serve)

    # cadence router
    from cadence.cli.router import add_router_args

    router = commands.add_parser(
        "router",
        usage="cadence router --worker URL [--worker URL ...] [--policy P] [--port P]",
        help="one address in front of several servers (data parallel)",
        description="Route OpenAI API requests over replicas started with `cadence serve`: "
        "round-robin, least-load, or cache-aware (the replica that already holds the "
        "prompt's prefix). Streams pass through.",
    )
    add_router_args(router)
    _add_log_level(router, "info")
    router.set_defaults(func=_cmd_router, parser=router)

    # cadence chat
    from cadence.cli.chat import add_chat_args

    chat = commands.add_parser("chat", help="chat with a running server in the terminal")
    add_chat_args(chat)
    _add_log_level(chat, "warning")
    chat.set_defaults(func=_cmd_chat, parser=chat)

    # cadence bench {throughput, latency, serve}
    bench = commands.add_parser(
        "bench",
        help="benchmarks",
        description="Offline benchmarks of the engine, in-process (throughput, latency), "
        "and a benchmark of a running server (serve).",
    )
    kinds = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    from cadence.bench.offline import add_latency_args, add_throughput_args

    tp = kinds.add_parser(
        "throughput",
        usage="cadence bench throughput [MODEL] [--dataset random|mixed] [options]",
        help="many requests at once: requests/s and tokens/s",
        description="Submit --num-prompts requests at once (random token ids, or the mixed "
        "set), ignore EOS, and report requests/s, total tokens/s and output tokens/s.",
    )
    add_throughput_args(tp)
    _add_log_level(tp, "info")
    add_engine_args(tp)
    tp.set_defaults(func=_cmd_bench_throughput, parser=tp)

    lat = kinds.add_parser(
        "latency",
        usage="cadence bench latency [MODEL] [--batch-size B] [--input-len N] "
        "[--output-len N] [options]",
        help="one batch: prefill time, per-step decode time",
        description="Run one batch of --batch-size random prompts after warm-up runs; "
        "report the end-to-end latency, prefill time, per-step decode time and decode "
        "tokens/s, timed around each engine step.",
    )
    add_latency_args(lat)
    _add_log_level(lat, "info")
    add_engine_args(lat)
    lat.set_defaults(func=_cmd_bench_latency, parser=lat)

    from cadence.bench.serve import add_bench_serve_args

    sv = kinds.add_parser(
        "serve",
        usage="cadence bench serve [--base-url URL] [--endpoint completions|chat] "
        "[--dataset-name random|shared-prefix|jsonl] [--max-concurrency C | --sweep C1,C2,...] "
        "[options]",
        help="a streaming client against a running server: TTFT, TPOT, ITL, throughput",
        description="Send --num-prompts streaming requests to an OpenAI-compatible server "
        "(--request-rate, --max-concurrency or --sweep), time each one on the client, and "
        "report TTFT, TPOT, ITL and end-to-end latency percentiles, throughput and goodput "
        "(--slo). Flags follow `vllm bench serve` where the meaning is the same.",
    )
    add_bench_serve_args(sv)
    _add_log_level(sv, "warning")
    sv.set_defaults(func=_cmd_bench_serve, parser=sv)
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


# ---- commands -------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    kwargs = check_engine_args(parser, args)
    from cadence import LLM, SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.sampling_seed,
    )
    try:
        params.verify()
    except ValueError as e:
        parser.error(str(e))
    if args.system is not None and not args.chat:
        parser.error("--system needs --chat")
    llm = LLM(**kwargs)
    if llm.tokenizer is None:
        parser.error("this model has no tokenizer, so it cannot take a text prompt")
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        out = llm.chat(messages, params, use_tqdm=False)[0]
    else:
        out = llm.generate(args.prompt, params, use_tqdm=False)[0]
    print(out.outputs[0].text)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from cadence.cli.serve import run_serve

    return run_serve(args)


def _cmd_router(args: argparse.Namespace) -> int:
    from cadence.cli.router import run_router

    return run_router(args)


def _cmd_chat(args: argparse.Namespace) -> int:
    from cadence.cli.chat import run_chat

    return run_chat(args)


def _cmd_bench_throughput(args: argparse.Namespace) -> int:
    kwargs = check_engine_args(args.parser, args)
    from cadence.bench.offline import run_throughput

    run_throughput(args, kwargs)
    return 0


def _cmd_bench_latency(args: argparse.Namespace) -> int:
    kwargs = check_engine_args(args.parser, args)
    from cadence.bench.offline import run_latency

    run_latency(args, kwargs)
    return 0


def _cmd_bench_serve(args: argparse.Namespace) -> int:
    from cadence.bench.serve import check_bench_serve_args, run_bench_serve

    check_bench_serve_args(args.parser, args)
    return run_bench_serve(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded by bench serve
    _setup_logging(args.log_level)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError) as e:
        # bad input discovered while loading (a missing model, a prompt too long, ...)
        print(f"cadence: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
