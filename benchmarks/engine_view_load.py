"""The engine view under load, read as the web app reads it (issue 37): is it the view's
polling that stalls, or do the requests wait before the engine?

    python benchmarks/engine_view_load.py [--concurrency 16] [--seconds 20] [--json PATH]
        [-- extra `cadence serve` flags]

Starts `cadence serve` (the default model, as `make serve`), keeps `--concurrency` streamed
chats in flight, and every second asks what the engine view asks, as it asks it: the three
calls at once (/v1/engine/stats, /steps, /requests). Prints one line a second: how long
each call took, the engine's running / waiting, the sequences the API holds (in_flight),
and the step count; then a summary of the calls' latencies and of the seconds the view
would have shown no running request while streams were open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def chat_forever(url: str, stop: asyncio.Event, open_streams: list[int]) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 128,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        while not stop.is_set():
            open_streams[0] += 1
            try:
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        if stop.is_set():
                            break
            finally:
                open_streams[0] -= 1


async def timed(c: httpx.AsyncClient, path: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = await c.get(path)
    return time.perf_counter() - t0, r.json()


async def watch(url: str, seconds: float, concurrency: int) -> dict:
    stop = asyncio.Event()
    open_streams = [0]
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        chats = [
            asyncio.create_task(chat_forever(url, stop, open_streams)) for _ in range(concurrency)
        ]
        t_start = time.perf_counter()
        since = 0
        while time.perf_counter() - t_start < seconds:
            t0 = time.perf_counter()
            (ts, stats), (tst, steps), (tr, reqs) = await asyncio.gather(
                timed(c, "/v1/engine/stats"),
                timed(c, f"/v1/engine/steps?since={since}&limit=400"),
                timed(c, "/v1/engine/requests?limit=100"),
            )
            since = steps["num_steps"]
            r = stats["requests"]
            row = {
                "t": round(t0 - t_start, 2),
                "stats_ms": round(1e3 * ts, 1),
                "steps_ms": round(1e3 * tst, 1),
                "requests_ms": round(1e3 * tr, 1),
                "all_ms": round(1e3 * max(ts, tst, tr), 1),
                "running": r["running"],
                "waiting": r["waiting"],
                "in_flight": r["in_flight"],
                "open_streams": open_streams[0],
                "num_steps": stats["num_steps"],
                "rows": len(reqs["requests"]),
                "last_step_ms": round(
                    sum(v for k, v in steps["steps"][-1].items() if k.endswith("_ms")), 1
                )
                if steps["steps"]
                else None,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
        stop.set()
        for t in chats:
            t.cancel()
        await asyncio.gather(*chats, return_exceptions=True)
    busy = [x for x in rows if x["open_streams"] > 0 and x["t"] > 2]
    return {
        "rows": rows,
        "stats_ms_p50": statistics.median(x["stats_ms"] for x in rows),
        "view_ms_p50": statistics.median(x["all_ms"] for x in rows),
        "view_ms_max": max(x["all_ms"] for x in rows),
        "readings_running_0_while_streams_open": sum(1 for x in busy if x["running"] == 0),
        "readings_while_streams_open": len(busy),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("serve_args", nargs="*")
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cadence.cli.main", "serve", "--port", str(port),
         "--log-level", "warning", *args.serve_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        result = asyncio.run(watch(url, args.seconds, args.concurrency))
        summary = {k: v for k, v in result.items() if k != "rows"}
        print(json.dumps(summary))
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
