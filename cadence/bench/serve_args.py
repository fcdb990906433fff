"""The flags of `cadence bench serve` and their checks (see cadence/bench/serve.py).

The soak flags (`--duration`, `--hangup-fraction`, `--invalid-fraction`, `--server-pid`)
turn a benchmark into a robustness run: keep the load on for a time, mix in clients that
hang up and bodies the server must refuse, probe `/health`, and watch the server's RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from cadence.bench import report
from cadence.bench.offline import _ratio
from cadence.bench.stats import parse_slo
from cadence.engine_args import non_negative_int, positive_float, positive_int

ENDPOINTS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}
# vLLM spells endpoints as paths (`--endpoint /v1/completions`); accept those too.
ENDPOINT_ALIASES = {path: name for name, path in ENDPOINTS.items()}
DATASETS = ("random", "shared-prefix", "jsonl")
DATASET_ALIASES = {"prefix_repetition": "shared-prefix", "custom": "jsonl"}
DEFAULT_NUM_PROMPTS = 100


class BenchError(ValueError):
    """A problem to report in one line (the CLI prints it and exits 1)."""


# ---- arguments ------------------------------------------------------------------------


def _concurrency_list(text: str) -> list[int]:
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a positive integer (want e.g. 1,4,16,64)"
            )
        values.append(int(item))
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
    return values


def _slo(text: str) -> dict[str, float]:
    try:
        return parse_slo(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _endpoint(text: str) -> str:
    name = ENDPOINT_ALIASES.get(text, text)
    if name not in ENDPOINTS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of: completions, chat (or /v1/completions, /v1/chat/completions)"
        )
    return name


def _dataset(text: str) -> str:
    name = DATASET_ALIASES.get(text, text)
    if name not in DATASETS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(DATASETS)}")
    return name


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be in [0, 1]")
    return value


def add_bench_serve_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument(
        "--base-url", default=None, help="the server (default: http://HOST:PORT from --host/--port)"
    )
    g.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    g.add_argument(
        "--endpoint",
        type=_endpoint,
        default="completions",
        help="completions (/v1/completions) or chat (/v1/chat/completions) (default: completions)",
    )
    g.add_argument("--model", default=None, help="model name to send (default: ask /v1/models)")
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for random prompts and the token-count cross-check, or 'none' "
        "(default: the server's model folder if it is on this machine, else SmolLM2's)",
    )
    g.add_argument(
        "--api-key",
        default=None,
        help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY or $CADENCE_API_KEY)",
    )
    g.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds to wait for a response or the next chunk (default: 600)",
    )
    g.add_argument(
        "--ready-check-timeout-sec",
        type=non_negative_int,
        default=0,
        help="wait up to this many seconds for the server to answer (default: 0, ask once)",
    )

    d = parser.add_argument_group("dataset")
    d.add_argument(
        "--dataset-name",
        type=_dataset,
        default="random",
        help="random, shared-prefix (alias prefix_repetition) or jsonl (alias custom) "
        "(default: random)",
    )
    d.add_argument("--dataset-path", default=None, help="the JSONL file (--dataset-name jsonl)")
    d.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help=f"requests per run (default: {DEFAULT_NUM_PROMPTS}; jsonl: every line)",
    )
    d.add_argument(
        "--random-input-len",
        type=positive_int,
        default=1024,
        help="random: prompt tokens (chat: of the user message; the template adds more) "
        "(default: 1024)",
    )
    d.add_argument(
        "--random-output-len",
        type=positive_int,
        default=128,
        help="random: max_tokens of each request (default: 128)",
    )
    d.add_argument(
        "--random-range-ratio",
        type=_ratio,
        default=0.0,
        help="lengths uniform in [len*(1-r), len*(1+r)] (default: 0)",
    )
    d.add_argument(
        "--random-images",
        type=int,
        default=0,
        metavar="N",
        help="random dataset, chat endpoint: N distinct random images (PNG data: URLs) "
        "before each prompt's text, for a vision-language model (default: 0)",
    )
    d.add_argument(
        "--random-image-size",
        default="448x448",
        metavar="WxH",
        help="the random images' size in pixels (default: 448x448)",
    )
    d.add_argument(
        "--prefix-repetition-num-prefixes",
        type=positive_int,
        default=10,
        help="shared-prefix: G system prompts; each gets --num-prompts / G questions (default: 10)",
    )
    d.add_argument(
        "--prefix-repetition-prefix-len",
        type=positive_int,
        default=256,
        help="shared-prefix: tokens of each system prompt (default: 256)",
    )
    d.add_argument(
        "--prefix-repetition-suffix-len",
        type=positive_int,
        default=256,
        help="shared-prefix: tokens of each question (default: 256)",
    )
    d.add_argument(
        "--prefix-repetition-output-len",
        type=positive_int,
        default=128,
        help="shared-prefix: max_tokens of each request (default: 128)",
    )
    d.add_argument(
        "--custom-output-len",
        type=positive_int,
        default=256,
        help="jsonl: max_tokens of lines that give none (default: 256)",
    )

    r = parser.add_argument_group("load")
    r.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="requests in flight at most (default: no limit)",
    )
    r.add_argument(
        "--sweep",
        type=_concurrency_list,
        default=None,
        metavar="C1,C2,...",
        help="one run per max concurrency, e.g. 1,4,16,64 (instead of --max-concurrency)",
    )
    r.add_argument(
        "--request-rate",
        type=positive_float,
        default=math.inf,
        help="requests/s, arriving as a Poisson process (default: inf, all at once)",
    )
    r.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of the arrival gaps: 1 is Poisson, below 1 burstier, above 1 "
        "steadier (default: 1)",
    )
    r.add_argument(
        "--num-warmups",
        type=non_negative_int,
        default=1,
        help="untimed requests before the first run (default: 1)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")

    s = parser.add_argument_group("sampling")
    s.add_argument(
        "--ignore-eos", action="store_true", help="generate max_tokens whatever the model says"
    )
    s.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    s.add_argument("--top-p", type=float, default=None, help="(default: the server's)")
    s.add_argument("--top-k", type=int, default=None, help="(default: the server's)")
    s.add_argument(
        "--extra-body", default=None, metavar="JSON", help="a JSON object merged into each body"
    )

    k = parser.add_argument_group("soak")
    k.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="keep --max-concurrency requests in flight until this many seconds have "
        "passed (the prompts are reused in turn) instead of sending --num-prompts once",
    )
    k.add_argument(
        "--hangup-fraction",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="this fraction of requests hang up: streamed ones after the first token or "
        "two, the others (stream: false) after a short delay (default: 0)",
    )
    k.add_argument(
        "--invalid-fraction",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="this fraction of requests send an invalid body and expect a 4xx with an "
        "OpenAI error object (default: 0)",
    )
    k.add_argument(
        "--server-pid",
        type=positive_int,
        default=None,
        metavar="PID",
        help="report the RSS of this process and its descendants (the engine), from /proc",
    )
    k.add_argument(
        "--rss-interval",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="with --server-pid: seconds between RSS samples (default: 10)",
    )
    k.add_argument(
        "--health-interval",
        type=positive_float,
        default=0.5,
        metavar="SECONDS",
        help="seconds between GET /health probes during a run (default: 0.5)",
    )

    o = parser.add_argument_group("results")
    o.add_argument(
        "--slo",
        type=_slo,
        default=None,
        metavar="ttft=MS,tpot=MS,e2el=MS",
        help="report goodput: requests/s within every limit given (milliseconds)",
    )
    o.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="vLLM's spelling of --slo: ttft:500 tpot:50",
    )
    o.add_argument("--save-json", metavar="PATH", help="write every record and the summary")
    o.add_argument(
        "--save-result",
        action="store_true",
        help="write the JSON to --result-dir/--result-filename (an automatic name by default)",
    )
    o.add_argument("--result-dir", default=None, help="(with --save-result; default: .)")
    o.add_argument("--result-filename", default=None, help="(with --save-result)")
    o.add_argument(
        "--scoreboard", metavar="PATH", help="append one markdown row per run to this file"
    )
    o.add_argument("--label", default=None, help="the run's name in the scoreboard and JSON")
    o.add_argument(
        "--plot",
        metavar="PNG",
        help="a sweep: throughput and TTFT / TPOT against concurrency; "
        "one run: TTFT and ITL distributions",
    )
    o.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def check_bench_serve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject flag combinations now, with a message naming the flags."""
    if args.sweep is not None and args.max_concurrency is not None:
        parser.error("give --sweep or --max-concurrency, not both")
    if args.goodput is not None:
        if args.slo is not None:
            parser.error("give --slo or --goodput, not both")
        try:
            args.slo = parse_slo(",".join(args.goodput))
        except ValueError as e:
            parser.error(f"argument --goodput: {e}")
    if args.dataset_name == "jsonl" and not args.dataset_path:
        parser.error("--dataset-name jsonl needs --dataset-path FILE")
    if args.dataset_path and args.dataset_name != "jsonl":
        parser.error("--dataset-path is for --dataset-name jsonl")
    if args.dataset_path and not os.path.isfile(args.dataset_path):
        parser.error(f"--dataset-path {args.dataset_path!r} is not a file")
    if args.random_images:
        if args.random_images < 0 or args.dataset_name != "random" or args.endpoint != "chat":
            parser.error(
                "--random-images N (N >= 0) goes with --dataset-name random and --endpoint chat"
            )
        try:
            w, h = (int(v) for v in args.random_image_size.lower().split("x"))
            assert 8 <= w <= 8192 and 8 <= h <= 8192
        except (ValueError, AssertionError):
            parser.error(
                f"--random-image-size must be WxH (8 to 8192 each), got {args.random_image_size!r}"
            )
        args.random_image_size = (w, h)
    if args.dataset_name == "shared-prefix":
        groups = args.prefix_repetition_num_prefixes
        n = args.num_prompts or DEFAULT_NUM_PROMPTS
        if n % groups:
            parser.error(
                f"--num-prompts ({n}) must be a multiple of --prefix-repetition-num-prefixes "
                f"({groups}): each system prompt gets the same number of questions"
            )
    if args.base_url is not None and not args.base_url.startswith(("http://", "https://")):
        parser.error(f"--base-url must start with http:// or https://, got {args.base_url!r}")
    if args.extra_body is not None:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            parser.error(f"--extra-body is not JSON: {e.msg}")
        if not isinstance(extra, dict):
            parser.error("--extra-body must be a JSON object")
        args.extra_body = extra
    if (args.result_dir or args.result_filename) and not args.save_result:
        parser.error("--result-dir and --result-filename go with --save-result")
    if args.temperature < 0:
        parser.error("--temperature must be >= 0")
    if args.hangup_fraction + args.invalid_fraction > 1.0:
        parser.error("--hangup-fraction plus --invalid-fraction must be at most 1")
    if args.duration is not None:
        if args.max_concurrency is None and args.sweep is None:
            parser.error(
                "--duration needs --max-concurrency (or --sweep): the clients to keep busy"
            )
        if not math.isinf(args.request_rate):
            parser.error(
                "--duration keeps the concurrency full; it does not go with --request-rate"
            )
    if args.server_pid is not None and not os.path.exists(f"/proc/{args.server_pid}"):
        parser.error(f"--server-pid {args.server_pid}: no such process (or no /proc)")
    if args.plot:
        try:
            report.check_matplotlib()
        except ValueError as e:
            parser.error(str(e))
