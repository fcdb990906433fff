"""A few requests in intake at a time, so that a burst of them cannot stall running streams.

A request's intake is its event-loop work between arrival (past the guard: key checked, body
read) and its prompt reaching the engine: routing, validation, the chat template, the send
(tokenizing waits in a thread). About a millisecond of this process's one thread. Asyncio
runs every ready task's next step before it returns to any: when 128 requests land at once,
the tasks that write the running streams' tokens wait behind 128 intake steps, and so does
each stream's next chunk. On the 2-core development machine (benchmarks/api_burst.py: 32
streams, a burst of 128 requests, one API process; 8 rounds each) the streams' gaps while
the burst was taken had a p50 of 35 ms and a p99 of 85 ms without the gate, against engine
steps of 17-26 ms (longest 35-55 ms); with 8 requests in intake at a time 25 and 45 ms, the
engine's own step times, while taking the burst lasted 0.39 s instead of 0.33 s.

The gate lets INTAKE_LIMIT POST requests through at once (CADENCE_INTAKE_LIMIT=N sets it, 0
turns the gate off); the others wait on it, costing the loop nothing. One leaves the gate
when the engine client has sent its prompt (the `request_submitted` hook, called in the
request's context), when it is answered without reaching the engine, or after HOLD_MAX_S: a
long prompt's tokenizing or a slow adapter load waits in a thread, not on the loop, and must
not hold back the requests behind it.
"""

from __future__ import annotations

import asyncio
import os

from cadence.engine.client import request_submitted

INTAKE_LIMIT = 8  # requests between arrival and the engine at once, per API process
HOLD_MAX_S = 0.1  # the longest one request keeps its place in the gate


class IntakeGate:
    """Pure ASGI middleware (inside the guard: a client that has not sent its body or its
    key holds no place)."""

    def __init__(self, app, limit: int | None = None, hold_max_s: float = HOLD_MAX_S) -> None:
        if limit is None:
            limit = int(os.environ.get("CADENCE_INTAKE_LIMIT", INTAKE_LIMIT))
        self.app = app
        self.hold_max_s = hold_max_s
        self.places = asyncio.Semaphore(limit) if limit > 0 else None

    async def __call__(self, scope, receive, send) -> None:
        if self.places is None or scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        await self.places.acquire()
        timer: asyncio.TimerHandle | None = None
        held = True

        def leave() -> None:
            nonlocal held
            if held:
                held = False
                if timer is not None:
                    timer.cancel()
                self.places.release()

        timer = asyncio.get_running_loop().call_later(self.hold_max_s, leave)
        token = request_submitted.set(leave)
        try:
            await self.app(scope, receive, send)
        finally:
            request_submitted.reset(token)
            leave()
