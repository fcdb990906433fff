"""`cadence serve [MODEL]`: the OpenAI-compatible server (API process + engine process)."""

from __future__ import annotations

import argparse
import logging

from cadence.cli.args import check_engine_args


def add_serve_args(parser: argparse.ArgumentParser) -> None:
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
        help="require 'Authorization: Bearer KEY' on /v1/* (or set CADENCE_API_KEY)",
    )
    s.add_argument(
        "--max-num-waiting",
        type=int,
        default=256,
        help="requests queued beyond --max-num-seqs before 429s (default: 256)",
    )
    s.add_argument(
        "--max-queued-prompt-tokens",
        type=int,
        default=None,
        help="prompt tokens queued before 429s (default: 64 x max_model_len)",
    )


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from cadence.config import EngineConfig
    from cadence.entrypoints.api_server import create_app

    kwargs = check_engine_args(args.parser, args)
    if args.max_num_waiting < 0:
        args.parser.error("--max-num-waiting must be >= 0")
    config = EngineConfig.from_kwargs(**kwargs)
    try:
        from setproctitle import setproctitle

        setproctitle("cadence::api")
    except ImportError:
        pass
    app = create_app(
        config,
        args.served_model_name,
        args.api_key,
        args.max_num_waiting,
        args.max_queued_prompt_tokens,
    )
    logging.getLogger("cadence").info("listening on http://%s:%d", args.host, args.port)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5
    )
    return 0
