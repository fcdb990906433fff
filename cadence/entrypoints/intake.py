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

The gate lets INTAKE_LIMIT requests to the generating endpoints (GATED_PATHS) through at once
(CADENCE_INTAKE_LIMIT=N sets it, 0 turns the gate off); the others wait on it, costing the
loop nothing, and every other request passes by. One leaves the gate when the engine client
has sent its prompt (the `request_submitted` hook, called in the request's context; a
request of several prompts, when the first is sent), when it is answered without reaching
the engine, or after HOLD_MAX_S: an image's download or a long prompt's tokenizing waits in a
thread, not on the loop, and must not hold back the requests behind it. A request that got
its place after the server began to drain is answered 503, as the guard answers later ones.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from cadence.engine.client import request_submitted
from cadence.entrypoints.guards import reply_error, shutting_down

INTAKE_LIMIT = 8  # requests between arrival and the engine at once, per API process
HOLD_MAX_S = 0.1  # the longest one request keeps its place in the gate
GATED_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"}
)


def intake_limit() -> int:
    """INTAKE_LIMIT, or CADENCE_INTAKE_LIMIT's (0: no gate)."""
    text = os.environ.get("CADENCE_INTAKE_LIMIT", str(INTAKE_LIMIT))
    if not text.strip().isdigit():
        raise ValueError(f"CADENCE_INTAKE_LIMIT must be a whole number >= 0, got {text!r}")
    return int(text)


class IntakeGate:
    """Pure ASGI middleware (inside the guard: a client that has not sent its body or its
    key holds no place)."""

    def __init__(
        self,
        app,
        draining: Callable[[], bool] = lambda: False,
        limit: int | None = None,
        hold_max_s: float = HOLD_MAX_S,
    ) -> None:
        limit = intake_limit() if limit is None else limit
        self.app = app
        self.draining = draining
        self.hold_max_s = hold_max_s
        self.places = asyncio.Semaphore(limit) if limit > 0 else None

    @property
    def free_places(self) -> int | None:
        return None if self.places is None else self.places._value

    async def __call__(self, scope, receive, send) -> None:
        if (
            self.places is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in GATED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        await self.places.acquire()
        if self.draining():
            self.places.release()
            await reply_error(shutting_down(), scope, receive, send)
            return
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
