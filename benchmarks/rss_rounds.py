"""Does the server's memory stay bounded? The same mixed load, round after round, and the
RSS of the API process and of the engine process after each round (issue 14, point 9).

    .venv/bin/python benchmarks/rss_rounds.py --rounds 5                  # starts a server
    .venv/bin/python benchmarks/rss_rounds.py --url http://127.0.0.1:8000 --pid 1234

Started here, the server is `cadence serve --kv-cache-memory 256MiB` on SmolLM2 (CPU),
plus `--server-arg` flags, under `--server-env NAME=VALUE` variables (for an A/B of, say,
MALLOC_ARENA_MAX). Every round sends the same requests (same seed): completions and chat,
streamed and not, n=1..3, prompts of 5 to ~400 tokens, a few structured outputs with
several schemas, and hang-ups (streams cut after the first chunk, plain requests after
0.3 s). After a round, the script waits until the server is idle (its running and waiting
gauges at 0) plus a second, then reads VmRSS from /proc. A server whose memory is bounded
shows growth in the first round or two (warm-up: allocator pools, caches filling) and a
plateau after; growth that continues round after round is a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cadence.bench.soak import process_name, process_tree, rss_mb  # noqa: E402

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "temps": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
        },
        "required": ["city"],
    },
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "level": {"enum": ["low", "mid", "high"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["ok", "level"],
    },
]
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
]


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def round_requests(seed: int, count: int) -> list[dict]:
    """The round's requests: {"path", "body", "hangup": None | seconds | "stream"}."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        chat = i % 2 == 1
        stream = i % 4 < 2
        words = rng.choice((5, 30, 120, 300))
        max_tokens = rng.choice((8, 16, 32))
        body: dict = {"model": "m", "max_tokens": max_tokens, "temperature": 0.7, "seed": i}
        if chat:
            body["messages"] = [{"role": "user", "content": _prompt(rng, words)}]
        else:
            body["prompt"] = _prompt(rng, words)
        if i % 7 == 3:
            body["n"] = rng.choice((2, 3))
        if i % 9 == 4:
            schema = SCHEMAS[(i // 9) % len(SCHEMAS)]
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            }
            if not chat:
                body["response_format"] = {"type": "json_object"}
        if stream:
            body["stream"] = True
        hangup = None
        if i % 10 == 6:
            hangup = "stream" if stream else 0.3
        path = "/v1/chat/completions" if chat else "/v1/completions"
        out.append({"path": path, "body": body, "hangup": hangup})
    return out


async def _send(client: httpx.AsyncClient, req: dict) -> str:
    body, hangup = req["body"], req["hangup"]
    try:
        if body.get("stream"):
            async with client.stream("POST", req["path"], json=body) as resp:
                async for line in resp.aiter_lines():
                    if hangup == "stream" and line.startswith("data:"):
                        return "hung up"
                return str(resp.status_code)
        if hangup is not None:
            try:
                resp = await asyncio.wait_for(client.post(req["path"], json=body), hangup)
            except TimeoutError:
                return "hung up"
        else:
            resp = await client.post(req["path"], json=body)
        return str(resp.status_code)
    except httpx.HTTPError as e:
        return type(e).__name__


async def run_round(url: str, reqs: list[dict], concurrency: int) -> dict[str, int]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def one(req: dict) -> str:
            req["body"]["model"] = model
            async with limit:
                return await _send(client, req)

        results = await asyncio.gather(*(one(r) for r in reqs))
    counts: dict[str, int] = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    return counts


def wait_idle(url: str, timeout: float = 120.0) -> None:
    """Until the running and waiting gauges are 0 (the aborted work drained), then 1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=30).text
        busy = 0.0
        for line in text.splitlines():
            if line.startswith(("cadence:num_requests_running", "cadence:num_requests_waiting")):
                busy += float(line.rsplit(" ", 1)[1])
        if busy == 0:
            break
        time.sleep(0.5)
    time.sleep(1.0)


def rss_by_role(pid: int) -> dict[str, float]:
    """{"api": MiB, "engine": MiB, "other": MiB} of the server's process tree."""
    out = {"api": 0.0, "engine": 0.0, "other": 0.0}
    for p in process_tree(pid):
        mb = rss_mb(p) or 0.0
        role = "api" if p == pid else "engine" if "cadence::engine" in process_name(p) else "other"
        out[role] += mb
    return out


def signal_tree(pid: int, sig: int, wait: float = 2.0) -> None:
    """Send `sig` to every Python process of the server (see benchmarks/memdebug), then
    give the handlers time to run (the engine's runs between steps)."""
    for p in process_tree(pid):
        if process_name(p).startswith("cadence::"):
            os.kill(p, sig)
    time.sleep(wait)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ)
    for item in args.server_env:
        name, _, value = item.partition("=")
        env[name] = value
    if args.memdebug:
        os.makedirs(args.memdebug, exist_ok=True)
        env["CADENCE_MEMDEBUG"] = os.path.abspath(args.memdebug)
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memdebug")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    cmd = [os.path.join(os.path.dirname(sys.executable), "cadence"), "serve",
           "--kv-cache-memory", args.kv_cache_memory, "--port", str(args.port),
           *args.server_arg]  # fmt: skip
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy in 600 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", help="a running server (with --pid); default: start one")
    ap.add_argument("--pid", type=int, help="the running server's API process")
    ap.add_argument("--port", type=int, default=8931)
    ap.add_argument("--kv-cache-memory", default="256MiB")
    ap.add_argument("--server-arg", action="append", default=[], help="one more serve flag")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--server-log", default=None, help="write the server's log here")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=30, help="per round (default: 30)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    ap.add_argument(
        "--memdebug",
        metavar="DIR",
        help="load benchmarks/memdebug in the server; after each round write gc counts (and "
        "tracemalloc's top sites, with --server-env PYTHONTRACEMALLOC=1) to DIR",
    )
    ap.add_argument(
        "--trim-probe",
        action="store_true",
        help="with --memdebug: after each round's reading, malloc_trim(0) in each process "
        "and read RSS again (what the allocator kept but did not use)",
    )
    args = ap.parse_args()
    if (args.url is None) != (args.pid is None):
        ap.error("give --url and --pid together, or neither")
    if (args.memdebug or args.trim_probe) and args.url is not None:
        ap.error("--memdebug and --trim-probe need a server started here")
    if args.trim_probe and not args.memdebug:
        ap.error("--trim-probe needs --memdebug DIR")
    proc = None
    if args.url is None:
        proc, url = start_server(args)
        pid = proc.pid
    else:
        url, pid = args.url.rstrip("/"), args.pid
    rows = []
    try:
        wait_idle(url)
        rows.append({"round": 0, **rss_by_role(pid), "seconds": 0.0, "results": {}})
        for r in range(1, args.rounds + 1):
            t = time.perf_counter()
            results = asyncio.run(
                run_round(url, round_requests(args.seed, args.requests), args.concurrency)
            )
            seconds = time.perf_counter() - t
            wait_idle(url)
            rows.append({"round": r, **rss_by_role(pid), "seconds": seconds, "results": results})
            _print_row(rows[-1], rows[-2])
            if args.trim_probe:
                signal_tree(pid, signal.SIGUSR2)
                trimmed = rss_by_role(pid)
                rows[-1]["after_trim"] = trimmed
                print(f"  after malloc_trim(0): api {trimmed['api']:.0f} MiB, "
                      f"engine {trimmed['engine']:.0f} MiB", flush=True)  # fmt: skip
            if args.memdebug:
                signal_tree(pid, signal.SIGUSR1, wait=5.0)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print()
    print("| round | API MiB | engine MiB | total MiB | delta MiB | seconds | answers |")
    print("|---|---|---|---|---|---|---|")
    for prev, row in zip([None, *rows], rows):
        total = row["api"] + row["engine"] + row["other"]
        delta = (
            "" if prev is None else f"{total - (prev['api'] + prev['engine'] + prev['other']):+.0f}"
        )
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(row["results"].items()))
        print(f"| {row['round']} | {row['api']:.0f} | {row['engine']:.0f} | {total:.0f} | "
              f"{delta} | {row['seconds']:.0f} | {answers} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "rows": rows}, f, indent=1)
    return 0


def _print_row(row: dict, prev: dict) -> None:
    total = row["api"] + row["engine"] + row["other"]
    before = prev["api"] + prev["engine"] + prev["other"]
    print(f"round {row['round']}: api {row['api']:.0f} MiB, engine {row['engine']:.0f} MiB, "
          f"total {total:.0f} ({total - before:+.0f}) in {row['seconds']:.0f} s; "
          f"{row['results']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
