"""`cadence router --worker URL ...`: one OpenAI-compatible address in front of replicas
started separately (`cadence serve` on other ports or machines)."""

from __future__ import annotations

import argparse
import logging
import os

from cadence.engine_args import non_negative_float

logger = logging.getLogger("cadence.router")


def add_routing_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The policy flags, shared by `cadence router` and `cadence serve -dp N`
    (`prefix`: "router-" there, so they cannot clash with engine flags)."""
    from cadence.router.policies import POLICIES

    g = parser.add_argument_group("routing")
    g.add_argument(
        f"--{prefix}policy",
        dest="router_policy",
        choices=POLICIES,
        default="cache-aware",
        help="which replica gets a request (default: cache-aware)",
    )
    g.add_argument(
        f"--{prefix}cache-threshold",
        dest="cache_threshold",
        type=float,
        default=0.5,
        help="cache-aware: route by prefix when the best match covers this fraction of the "
        "prompt (default: 0.5)",
    )
    g.add_argument(
        f"--{prefix}balance-abs-threshold",
        dest="balance_abs",
        type=int,
        default=32,
        help="cache-aware: balance load first when the busiest replica holds this many more "
        "sequences than the idlest (default: 32) ...",
    )
    g.add_argument(
        f"--{prefix}balance-rel-threshold",
        dest="balance_rel",
        type=float,
        default=1.5,
        help="... and this many times as many (default: 1.5)",
    )


def add_router_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker",
        dest="workers",
        action="append",
        default=[],
        metavar="URL",
        help="a replica's base URL, e.g. http://127.0.0.1:8001 (repeat the flag)",
    )
    parser.add_argument(
        "--decode",
        dest="workers",
        action="append",
        metavar="URL",
        help="disaggregated serving: a decode engine (`cadence serve --kv-role decode`); "
        "same as --worker",
    )
    parser.add_argument(
        "--prefill",
        dest="prefill",
        action="append",
        default=[],
        metavar="URL",
        help="disaggregated serving: a prefill engine (`cadence serve --kv-role prefill`); "
        "each request is prefilled there first, then decoded on a --decode engine",
    )
    parser.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer for the prefix indexes (default: the replicas' model folder when it "
        "is on this machine, else SmolLM2's)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (the key goes "
        "on to the replicas as the client sent it; the router polls them with it too) "
        "(default: $CADENCE_API_KEY)",
    )
    parser.add_argument(
        "--kv-transfer-secret",
        default=None,
        help="disaggregated serving: the deployment's secret, the same as the engines' "
        "(better: $CADENCE_KV_TRANSFER_SECRET; a flag's value shows in the process list)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=non_negative_float,
        default=0.0,
        help="wait up to this many seconds for every replica to be healthy (default: 0)",
    )
    add_door_args(parser)
    add_routing_args(parser)


def add_door_args(parser: argparse.ArgumentParser, serve: bool = False) -> None:
    """The router's own door. `cadence serve -dp N` (`serve`) has --allowed-hosts and
    --metrics-public already, as the server's own flags."""
    g = parser.add_argument_group("router door")
    if not serve:
        g.add_argument(
            "--allowed-hosts",
            default=None,
            metavar="NAMES",
            help="Host header names answered, comma-separated, '*' for any (default: the "
            "loopback names when bound to loopback, any otherwise)",
        )
        g.add_argument(
            "--metrics-public", action="store_true", help="serve /metrics without the API key"
        )
    g.add_argument(
        "--replica-timeout",
        type=non_negative_float,
        default=600.0,
        help="seconds a replica may send nothing mid-answer before the request fails with "
        "504 (0: no bound; a replica down for 8 s is given up on anyway) (default: 600)",
    )


def router_options(args: argparse.Namespace, kv_secret: str | None = None):
    from cadence.entrypoints.guards import parse_allowed_hosts
    from cadence.router.app import RouterOptions

    return RouterOptions(
        api_key=args.api_key or os.environ.get("CADENCE_API_KEY"),
        kv_transfer_secret=kv_secret,
        allowed_hosts=parse_allowed_hosts(args.allowed_hosts, args.host),
        metrics_public=args.metrics_public,
        replica_timeout_s=args.replica_timeout or None,
    )


def load_router_tokenizer(path: str | None, urls: list[str]):
    """The replicas' tokenizer when it can be found here; routing works without one."""
    import httpx

    from cadence.tokenizer import load_tokenizer

    candidates = [path] if path else []
    for url in urls:
        try:
            root = httpx.get(url.rstrip("/") + "/v1/models", timeout=5).json()["data"][0]["root"]
            candidates.append(root)
        except Exception:  # unreachable or protected: try the next one
            continue
    for c in candidates:
        if c and os.path.isdir(c):
            try:
                return load_tokenizer(c)
            except Exception as e:
                logger.warning("could not load the tokenizer at %s: %s", c, e)
    try:
        from cadence.loader.model_path import resolve_model_path

        return load_tokenizer(resolve_model_path(None))
    except Exception as e:
        logger.warning("routing without a tokenizer (%s): prefixes keyed by bytes", e)
        return None


def policy_kwargs(args: argparse.Namespace) -> dict:
    if args.router_policy != "cache-aware":
        return {}
    return {
        "cache_threshold": args.cache_threshold,
        "balance_abs": args.balance_abs,
        "balance_rel": args.balance_rel,
    }


def run_router(args: argparse.Namespace) -> int:
    from cadence.entrypoints.launcher import run_app
    from cadence.router.app import create_router_app

    if not 0.0 <= args.cache_threshold <= 1.0:
        args.parser.error("--cache-threshold must be in [0, 1]")
    if not args.workers:
        args.parser.error("give at least one --worker (or --decode) URL")
    from cadence.config import KV_SECRET_ENV, MIN_SECRET_CHARS

    secret = args.kv_transfer_secret or os.environ.get(KV_SECRET_ENV) or None
    if args.prefill and len(secret or "") < MIN_SECRET_CHARS:
        args.parser.error(
            f"--prefill needs the deployment's secret, of {MIN_SECRET_CHARS} characters or "
            f"more: ${KV_SECRET_ENV} or --kv-transfer-secret"
        )
    from cadence.cli.listen import listen

    if (socks := listen(args)) is None:  # (before the tokenizer loads: a taken port fails now)
        return 1
    tokenizer = load_router_tokenizer(args.tokenizer, args.workers)
    app = create_router_app(
        args.workers,
        args.router_policy,
        tokenizer,
        startup_timeout_s=args.startup_timeout,
        prefill_urls=args.prefill or None,
        options=router_options(args, secret),
        **policy_kwargs(args),
    )
    logger.info("router listening on http://%s:%d", args.host, socks[0].getsockname()[1])
    return run_app(app, socks)
