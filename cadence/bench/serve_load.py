"""The load loop of `cadence bench serve`: which request goes when, and of which kind.

Two ways to run:
- a fixed count (the default): one request per prompt, on the arrival schedule (`delays`),
  at most `concurrency` in flight;
- for a time (`duration`): `concurrency` clients, each sending the next prompt (in turn,
  from the start again when they run out) as soon as its last request ended, until the
  time is up; requests in flight then finish.

Each request is, by a seeded draw, a normal one (timed, a `RequestRecord`), a hang-up, or
an invalid body (see cadence/bench/soak.py); only normal requests enter the latency figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cadence.bench.datasets import BenchPrompt
from cadence.bench.serve_args import ENDPOINTS
from cadence.bench.serve_client import send_request
from cadence.bench.soak import INVALID_KINDS, SoakTally, send_hangup, send_invalid
from cadence.bench.stats import RequestRecord

if TYPE_CHECKING:
    import httpx


def arrival_delays(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before sending each of n requests (the first goes at once): gamma
    gaps of mean 1/rate and shape `burstiness` (1: a Poisson process), as vLLM draws them."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    return [0.0] + [rng.gammavariate(burstiness, theta) for _ in range(n - 1)]


@dataclass
class LoadPlan:
    """What one run sends. Fractions are of all requests; `duration` in seconds, or None
    for one request per prompt."""

    chat: bool
    model: str
    concurrency: int | None
    delays: list[float]
    duration: float | None = None
    hangup_fraction: float = 0.0
    invalid_fraction: float = 0.0
    seed: int = 0


class _Kinds:
    """The seeded draw of each request's kind, and of how a hang-up hangs up."""

    def __init__(self, plan: LoadPlan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed * 7919 + 17)

    def next(self) -> tuple[str, object]:
        """("normal", None), ("invalid", kind) or ("hangup", (stream, cut))."""
        x = self.rng.random()
        p = self.plan
        if x < p.invalid_fraction:
            return "invalid", self.rng.choice(INVALID_KINDS)
        if x < p.invalid_fraction + p.hangup_fraction:
            stream = self.rng.random() < 0.5
            # streamed: after 1 or 2 text chunks; not streamed: after 50-500 ms
            cut = float(self.rng.choice((1, 2))) if stream else self.rng.uniform(0.05, 0.5)
            return "hangup", (stream, cut)
        return "normal", None


async def run_requests(
    client: httpx.AsyncClient,
    prompts: list[BenchPrompt],
    bodies: list[dict],
    plan: LoadPlan,
    progress: bool,
    desc: str,
) -> tuple[list[RequestRecord], float, SoakTally]:
    """Send the run's requests. Returns the normal requests' records (in send order), the
    duration in seconds (first send to last answer), and the counts of the other kinds."""
    from tqdm import tqdm

    path = ENDPOINTS["chat" if plan.chat else "completions"]
    kinds = _Kinds(plan)
    tally = SoakTally()
    total = None if plan.duration is not None else len(prompts)
    bar = tqdm(total=total, desc=desc, disable=not progress, file=sys.stderr, leave=False)
    t0 = time.perf_counter()

    async def send(i: int) -> RequestRecord | None:
        """Request i (prompt i mod the prompts), of the next kind drawn."""
        p = prompts[i % len(prompts)]
        body = bodies[i % len(prompts)]
        kind, how = kinds.next()
        tally.sent[kind] += 1
        rec = None
        if kind == "invalid":
            await send_invalid(client, path, str(how), plan.model, plan.chat, tally)
        elif kind == "hangup":
            stream, cut = how  # type: ignore[misc]
            await send_hangup(client, path, body, plan.chat, stream, cut, tally)
        else:
            rec = RequestRecord(index=i, max_tokens=p.max_tokens, group=p.group)
            rec.tokenizer_prompt_tokens = p.expected_prompt_tokens
            await send_request(client, path, body, plan.chat, rec, t0)
        bar.update(1)
        return rec

    if plan.duration is None:
        results = await _fixed_count(send, len(prompts), plan)
    else:
        results = await _for_a_time(send, plan.concurrency or 1, plan.duration, t0)
    duration = time.perf_counter() - t0
    bar.close()
    return [r for r in results if r is not None], duration, tally


async def _fixed_count(send, n: int, plan: LoadPlan) -> list[RequestRecord | None]:
    limit = asyncio.Semaphore(plan.concurrency) if plan.concurrency else contextlib.nullcontext()

    async def one(i: int) -> RequestRecord | None:
        async with limit:
            return await send(i)

    tasks = []
    t0 = time.perf_counter()
    send_at = 0.0  # seconds after t0; sleeping to absolute times keeps the gaps from drifting
    for i in range(n):
        send_at += plan.delays[i]
        wait = send_at - (time.perf_counter() - t0)
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i)))
    return list(await asyncio.gather(*tasks))


async def _for_a_time(send, clients: int, duration: float, t0: float) -> list[RequestRecord | None]:
    counter = itertools.count()
    results: list[RequestRecord | None] = []

    async def client_loop() -> None:
        while time.perf_counter() - t0 < duration:
            results.append(await send(next(counter)))

    await asyncio.gather(*(client_loop() for _ in range(clients)))
    results.sort(key=lambda r: -1 if r is None else r.index)
    return results
