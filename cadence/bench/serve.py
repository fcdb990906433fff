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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cadence.bench import report
from cadence.bench.datasets import (
    BenchPrompt,
    count_prompt_tokens,
    count_text_tokens,
    load_jsonl,
    random_prompts,
    shared_prefix_prompts,
)
from cadence.bench.offline import _ratio
from cadence.bench.stats import RequestRecord, parse_slo, summarize, token_check
from cadence.cli.args import non_negative_int, positive_float, positive_int

if TYPE_CHECKING:
    import httpx

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
    if args.plot:
        try:
            report.check_matplotlib()
        except ValueError as e:
            parser.error(str(e))


# ---- talking to the server --------------------------------------------------------------


@dataclass
class ServerInfo:
    base_url: str
    model: str
    model_root: str | None  # /v1/models' "root" (Cadence: the model folder)
    version: dict[str, Any] | None


def base_url(args: argparse.Namespace) -> str:
    url = args.base_url or f"http://{args.host}:{args.port}"
    return url.rstrip("/").removesuffix("/v1")


def make_client(args: argparse.Namespace) -> httpx.AsyncClient:
    import httpx

    key = args.api_key or os.environ.get("OPENAI_API_KEY") or os.environ.get("CADENCE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        base_url=base_url(args),
        headers=headers,
        timeout=httpx.Timeout(args.request_timeout, connect=min(30.0, args.request_timeout)),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI error body, or the body's start."""
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw[:200].decode(errors="replace")


async def _get_models(client: httpx.AsyncClient, timeout_s: int) -> httpx.Response:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await client.get("/v1/models")
        except httpx.TransportError as e:
            if time.monotonic() >= deadline:
                raise BenchError(f"cannot reach the server at {client.base_url}: {e}") from None
            await asyncio.sleep(1.0)


async def server_info(client: httpx.AsyncClient, args: argparse.Namespace) -> ServerInfo:
    """The model to send (--model or the first of /v1/models) and the server's /version."""
    resp = await _get_models(client, args.ready_check_timeout_sec)
    model, root = args.model, None
    if resp.status_code == 200:
        data = resp.json().get("data") or []
        ids = [m.get("id") for m in data]
        if model is None:
            if not ids:
                raise BenchError("/v1/models lists no model; give --model")
            model = ids[0]
        elif model not in ids:
            print(f"warning: --model {model!r} is not in /v1/models ({ids})", file=sys.stderr)
        root = next((m.get("root") for m in data if m.get("id") == model), None)
    elif resp.status_code == 401:
        raise BenchError(
            f"the server refused the API key (401: {_error_message(resp.content)}); give --api-key"
        )
    elif model is None:
        raise BenchError(
            f"/v1/models answered {resp.status_code} ({_error_message(resp.content)}); give --model"
        )
    version = None
    with contextlib.suppress(Exception):
        v = await client.get("/version")
        if v.status_code == 200:
            version = v.json()
    return ServerInfo(str(client.base_url).rstrip("/"), model, root, version)


def request_body(p: BenchPrompt, model: str, chat: bool, args: argparse.Namespace) -> dict:
    """The streaming request of one prompt."""
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": args.temperature,
    }
    if chat:
        body["messages"] = p.as_chat()
        if p.max_tokens is not None:
            body["max_completion_tokens"] = p.max_tokens
    else:
        body["prompt"] = p.prompt
        if p.max_tokens is not None:
            body["max_tokens"] = p.max_tokens
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if args.top_k is not None:
        body["top_k"] = args.top_k
    if args.extra_body:
        body.update(args.extra_body)
    return body


def _chunk_text(chunk: dict[str, Any], chat: bool) -> str:
    """The text a chunk carries (chat: delta.content; the role-only first chunk has none)."""
    parts = []
    for choice in chunk.get("choices") or []:
        if chat:
            parts.append((choice.get("delta") or {}).get("content") or "")
        else:
            parts.append(choice.get("text") or "")
    return "".join(parts)


async def send_request(
    client: httpx.AsyncClient, path: str, body: dict, chat: bool, rec: RequestRecord, t0: float
) -> None:
    """Stream one request and fill `rec`'s times (seconds) and the server's usage."""
    import httpx

    st = time.perf_counter()
    rec.start = st - t0
    last = st
    pieces: list[str] = []
    done = False
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {_error_message(await resp.aread())}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = f"error in stream: {_error_message(data.encode())}"
                    break
                if chunk.get("usage"):
                    rec.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    rec.output_tokens = chunk["usage"].get("completion_tokens")
                    rec.usage_source = "server"
                text = _chunk_text(chunk, chat)
                if text:
                    if rec.ttft is None:
                        rec.ttft = now - st
                    else:
                        rec.itls.append(now - last)
                    last = now
                    pieces.append(text)
            rec.e2e = time.perf_counter() - st
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e or 'no detail'}"
    except json.JSONDecodeError as e:
        rec.error = f"bad JSON in the stream: {e.msg}"
    rec.generated_text = "".join(pieces)
    if not rec.error and not done:
        rec.error = "the stream ended without data: [DONE]"
    rec.success = not rec.error


def arrival_delays(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before sending each of n requests (the first goes at once): gamma
    gaps of mean 1/rate and shape `burstiness` (1: a Poisson process), as vLLM draws them."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    return [0.0] + [rng.gammavariate(burstiness, theta) for _ in range(n - 1)]


async def run_requests(
    client: httpx.AsyncClient,
    prompts: list[BenchPrompt],
    bodies: list[dict],
    chat: bool,
    concurrency: int | None,
    delays: list[float],
    progress: bool,
    desc: str,
) -> tuple[list[RequestRecord], float]:
    """Send the requests on their schedule, at most `concurrency` in flight; the records
    (in prompt order) and the duration in seconds, first send to last response."""
    from tqdm import tqdm

    path = ENDPOINTS["chat" if chat else "completions"]
    limit = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()
    bar = tqdm(total=len(prompts), desc=desc, disable=not progress, file=sys.stderr, leave=False)

    async def one(i: int, p: BenchPrompt) -> RequestRecord:
        rec = RequestRecord(index=i, max_tokens=p.max_tokens, group=p.group)
        rec.tokenizer_prompt_tokens = p.expected_prompt_tokens
        async with limit:
            await send_request(client, path, bodies[i], chat, rec, t0)
        bar.update(1)
        return rec

    tasks = []
    t0 = time.perf_counter()
    send_at = 0.0  # seconds after t0; sleeping to absolute times keeps the gaps from drifting
    for i, p in enumerate(prompts):
        send_at += delays[i]
        wait = send_at - (time.perf_counter() - t0)
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, p)))
    records = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    bar.close()
    return list(records), duration


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
        from cadence.loader.loader import resolve_model_path

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
    records, _ = await run_requests(
        client, prompts, bodies, chat, conc, [0.0] * n, False, "warm-up"
    )
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
    records, duration = await run_requests(
        client, prompts, bodies, chat, concurrency, delays, not args.disable_tqdm, desc
    )
    fill_token_counts(records, tokenizer)
    return {
        "max_concurrency": concurrency,
        "request_rate": _rate_json(args.request_rate),
        "burstiness": args.burstiness,
        "seed": seed,
        "summary": summarize(records, duration, args.slo),
        "token_check": token_check(records, args.ignore_eos),
        "requests": [r.to_json() for r in records],
    }


def _rate_json(rate: float) -> float | None:
    """JSON has no infinity: an unlimited request rate is null."""
    return None if math.isinf(rate) else rate


def _print_run(run: dict[str, Any]) -> None:
    print(report.format_run(run))
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
    if not any(r["summary"]["completed"] for r in runs):
        print("cadence: error: every request failed", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "BenchError",
    "add_bench_serve_args",
    "arrival_delays",
    "bench",
    "build_prompts",
    "check_bench_serve_args",
    "request_body",
    "run_bench_serve",
    "send_request",
]
