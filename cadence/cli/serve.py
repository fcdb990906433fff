"""`cadence serve [MODEL]`: the OpenAI-compatible server (API process + engine process)."""

from __future__ import annotations

import argparse
import logging

from cadence.engine_args import check_engine_args, non_negative_float, positive_float, positive_int


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    from cadence.cli.router import add_door_args, add_routing_args

    add_routing_args(parser, prefix="router-")
    s = parser.add_argument_group("server")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1, this machine only)",
    )
    s.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    s.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the model path)",
    )
    s.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every endpoint but /health "
        "(or set CADENCE_API_KEY)",
    )
    s.add_argument(
        "--admin-api-key",
        default=None,
        help="the key of the admin endpoints (/start_profile, /stop_profile) and of other "
        "users' request ids in /v1/engine/requests (or set CADENCE_ADMIN_API_KEY; default: "
        "the --api-key)",
    )
    s.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="NAMES",
        help="Host header names the server answers, comma-separated, '*' for any (default: "
        "localhost, 127.0.0.1 and ::1 when bound to loopback, any otherwise): refuses web "
        "pages that re-point their own name at this server (DNS rebinding)",
    )
    s.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve /metrics without the API key (for a Prometheus scraper)",
    )
    s.add_argument(
        "--max-num-waiting",
        type=int,
        default=256,
        help="sequences (prompts x n) queued beyond --max-num-seqs before 429s (default: 256)",
    )
    s.add_argument(
        "--max-queued-prompt-tokens",
        type=int,
        default=None,
        help="prompt tokens queued before 429s (default: 64 x max_model_len)",
    )
    s.add_argument(
        "--engine-stall-timeout",
        type=positive_float,
        default=300.0,
        help="seconds the engine may make no progress while requests wait before the server "
        "declares it wedged, fails its requests and exits 1 (default: 300)",
    )
    s.add_argument(
        "--data-parallel-size",
        "-dp",
        type=positive_int,
        default=1,
        help="replicas of the whole server (each its own engine, GPU(s) or CPU cores) behind "
        "one router on --port (default: 1)",
    )
    s.add_argument(
        "--api-server-count",
        type=positive_int,
        default=None,
        metavar="N",
        help="API processes (HTTP, tokenizing, detokenizing, streaming) in front of the one "
        "engine, sharing --port (default: one per 8 cores beside a GPU engine, at most 4; "
        "1 on a CPU engine)",
    )
    s.add_argument(
        "--shutdown-timeout",
        type=non_negative_float,
        default=30.0,
        help="on SIGTERM, seconds running requests get to finish before they are aborted "
        "(default: 30)",
    )
    s.add_argument(
        "--responses-store-size",
        type=int,
        default=0,
        metavar="N",
        help="keep the last N /v1/responses in memory, so previous_response_id and "
        "GET /v1/responses/{id} work (default: 0, stateless)",
    )
    s.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="put the model's thinking into reasoning_content (chat), a reasoning item "
        "(Responses), a thinking block (Messages): deepseek_r1, qwen3 or gpt_oss",
    )
    s.add_argument(
        "--tool-call-parser",
        default="auto",
        metavar="NAME",
        help="the format tool calls are read in: hermes, llama3_json, mistral, "
        "qwen3_coder, deepseek_v3, openai (GPT-OSS), or auto (default: from the chat "
        "template; Hermes when the template does not know tools)",
    )
    s.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) served by name, with --enable-lora: NAME=PATH, "
        'or a JSON object {"name": ..., "path": ..., "base_model_name": ...}',
    )
    s.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=[],
        metavar="DOMAIN",
        help="hosts (and their subdomains) whose http(s) image URLs the server fetches for a "
        "vision-language model, each within 10 s and 20 MiB, no redirects (default: none; "
        "data: URLs are always accepted)",
    )
    add_door_args(parser, serve=True)


def run_serve(args: argparse.Namespace) -> int:
    from cadence.config import EngineConfig
    from cadence.entrypoints.api_server import ServerOptions, create_app
    from cadence.entrypoints.guards import parse_allowed_hosts
    from cadence.entrypoints.launcher import serve

    kwargs = check_engine_args(args.parser, args)
    if args.max_num_waiting < 0:
        args.parser.error("--max-num-waiting must be >= 0")
    if args.responses_store_size < 0:
        args.parser.error("--responses-store-size must be >= 0")
    if args.reasoning_parser is not None:
        from cadence.entrypoints.reasoning import make_reasoning_parser

        try:
            make_reasoning_parser(args.reasoning_parser)
        except ValueError as e:
            args.parser.error(f"--reasoning-parser: {e}")
    from cadence.entrypoints.tool_parsers import tool_parser_factory

    try:
        tool_parser_factory(args.tool_call_parser)
    except ValueError as e:
        args.parser.error(f"--tool-call-parser: {e}")
    from cadence.entrypoints.lora_adapters import LoRAModule

    try:
        lora_modules = tuple(LoRAModule.parse(m) for m in args.lora_modules)
    except ValueError as e:
        args.parser.error(str(e))
    if lora_modules and not kwargs.get("enable_lora"):
        args.parser.error("--lora-modules needs --enable-lora")
    if args.data_parallel_size > 1 and args.responses_store_size:
        # (each replica would keep its own: a follow-up routed elsewhere would not find it)
        args.parser.error("--responses-store-size keeps responses in one server: not with -dp")
    from cadence.cli.listen import listen

    if args.data_parallel_size > 1:
        from cadence.cli.data_parallel import run_data_parallel

        if (socks := listen(args)) is None:
            return 1
        return run_data_parallel(args, kwargs, socks)
    config = EngineConfig.from_kwargs(**kwargs)
    config.serving = True  # defaults for streams (EngineConfig.fill_defaults)
    count = args.api_server_count
    if count is None:
        from cadence.entrypoints.api_servers import default_api_server_count

        count = default_api_server_count(config.device)
    if count > 1 and args.responses_store_size:
        # (each API process would keep its own: a follow-up answered by another would miss)
        args.parser.error(
            "--responses-store-size keeps responses in one process: not with --api-server-count > 1"
        )
    if (socks := listen(args)) is None:  # before the engine loads (entrypoints/listener.py)
        return 1
    port = socks[0].getsockname()[1]  # (--port 0: the one the OS picked)
    try:
        from setproctitle import setproctitle

        setproctitle("cadence::serve" if count > 1 else "cadence::api")
    except ImportError:
        pass
    from cadence.allocator import limit_arenas

    limit_arenas()  # before uvicorn, ZMQ and the thread pools start threads
    options = ServerOptions(
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        allowed_hosts=parse_allowed_hosts(args.allowed_hosts, args.host),
        metrics_public=args.metrics_public,
        max_num_waiting=args.max_num_waiting,
        max_queued_prompt_tokens=args.max_queued_prompt_tokens,
        engine_stall_timeout=args.engine_stall_timeout,
        shutdown_timeout=args.shutdown_timeout,
        responses_store_size=args.responses_store_size,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        lora_modules=lora_modules,
        api_server_count=count,
        allowed_media_domains=tuple(d.lower().strip(".") for d in args.allowed_media_domains),
    )
    if count > 1:
        from cadence.entrypoints.api_servers import run_api_servers

        logging.getLogger("cadence").info(
            "listening on http://%s:%d (%d API processes)", args.host, port, count
        )
        return run_api_servers(config, options, socks, args.host, args.shutdown_timeout)
    app = create_app(config, options)
    logging.getLogger("cadence").info("listening on http://%s:%d", args.host, port)
    return serve(app, args.host, port, args.shutdown_timeout, socks)
