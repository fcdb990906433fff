"""What a burst of new requests does to the streams already running (issue 37).

Against a running server: STREAMS long completions stream (EOS ignored); once they are all
flowing, BURST short requests arrive at once. Printed per round, as JSON: the streams' gaps
between chunks (ms) in the seconds before the burst and while it lasts, beside the engine's
own step times over the burst (its /v1/engine/steps timeline). A gap longer than the longest
step is time the tokens spent waiting in the API process (taking the burst's requests) or
on the way to the client, not in the engine.

    cadence serve MODEL --port 8000 &
    python benchmarks/api_burst.py --base-url http://127.0.0.1:8000 --streams 32 --burst 128
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time

import aiohttp

from cadence.engine.step_timeline import PHASES


def pct(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None


async def stream(session, url: str, body: dict, times: list[float]) -> None:
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content.iter_any():
            times.append(time.perf_counter())


async def one_round(session, base: str, model: str, args) -> dict:
    url = base + "/v1/completions"
    long_body = {"model": model, "prompt": "hello there " * 8, "stream": True,
                 "max_tokens": args.stream_tokens, "ignore_eos": True}  # fmt: skip
    short_body = {"model": model, "prompt": "word " * args.burst_prompt_words, "stream": True,
                  "max_tokens": 2, "ignore_eos": True}  # fmt: skip
    times: list[list[float]] = [[] for _ in range(args.streams)]
    tasks = [asyncio.create_task(stream(session, url, long_body, t)) for t in times]
    await asyncio.sleep(args.settle_s)
    async with session.get(base + "/v1/engine/steps?limit=1") as r:
        recent = (await r.json())["steps"]  # (none: the server keeps no timeline)
        last = recent[-1]["id"] if recent else 0
    t0 = time.perf_counter()
    await asyncio.gather(*(stream(session, url, short_body, []) for _ in range(args.burst)))
    t1 = time.perf_counter()
    async with session.get(base + f"/v1/engine/steps?since={last}&limit=100000") as r:
        steps = (await r.json())["steps"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    def gaps(lo: float, hi: float) -> list[float]:
        return sorted(1e3 * (b - a) for ts in times for a, b in zip(ts, ts[1:]) if lo <= b <= hi)

    before, during = gaps(t0 - args.settle_s / 2, t0), gaps(t0, t1)
    step_ms = sorted(sum(s[f"{p}_ms"] for p in PHASES) for s in steps)
    return {
        "streams": args.streams,
        "burst": args.burst,
        "burst_s": round(t1 - t0, 3),
        "gap_ms_before": {"p50": pct(before, 0.5), "p99": pct(before, 0.99), "max": pct(before, 1)},
        "gap_ms_during": {"p50": pct(during, 0.5), "p99": pct(during, 0.99), "max": pct(during, 1)},
        "engine_steps_during": len(step_ms),
        "engine_step_ms_during": {"p50": pct(step_ms, 0.5), "max": pct(step_ms, 1)},
    }


async def main(args) -> None:
    base = args.base_url.rstrip("/")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.get(base + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        for _ in range(args.rounds):
            # No collection while gaps are timed: a full one here paused every stream of
            # the third round by 150-300 ms (this client's own pause, not the server's).
            gc.collect()
            gc.disable()
            try:
                row = await one_round(session, base, model, args)
            finally:
                gc.enable()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--burst", type=int, default=128)
    ap.add_argument("--stream-tokens", type=int, default=1500, help="each stream's max_tokens")
    ap.add_argument("--burst-prompt-words", type=int, default=100)
    ap.add_argument("--settle-s", type=float, default=3.0, help="streaming before the burst")
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
