"""The replicas behind a router: their address, health and load.

Load is what the replica's engine last reported (`/v1/engine/stats`: running + waiting
sequences, polled every POLL_INTERVAL_S) plus the requests this router has sent it since
that reading and not seen finish: between two polls a burst still spreads.

Health: a replica whose /health fails (or whose connection fails while the router uses it)
leaves the rotation at once; the poller brings it back when /health answers 200 again. One
that stays down for GIVE_UP_S (stopped, wedged, unreachable) is given up on: `gone` is set,
and the requests it still holds end with an error rather than wait on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from cadence.router.prefix_index import PrefixIndex

logger = logging.getLogger("cadence.router")

POLL_INTERVAL_S = 1.0
POLL_TIMEOUT_S = 2.0
GIVE_UP_S = 8.0  # down this long: its in-flight requests end (502 / an SSE error event)
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Replica:
    url: str
    index: int
    healthy: bool = False
    engine_load: int = 0  # running + waiting, at the last poll
    in_flight: int = 0  # requests this router is forwarding to it now
    sent_since_poll: int = 0  # of which started after the last poll
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)
    last_error: str | None = None
    stats: dict = field(default_factory=dict)  # its last /v1/engine/stats
    info: dict = field(default_factory=dict)  # its /version (read when it joins)
    down_since: float | None = None  # time.monotonic() when it left the rotation
    # Set when the router gives up on it (down GIVE_UP_S); a fresh one when it is back.
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    session: Any = None  # aiohttp.ClientSession: the clients' requests (ReplicaSet opens it)

    @property
    def load(self) -> int:
        """Sequences it holds, as best known now."""
        return max(self.engine_load + self.sent_since_poll, self.in_flight)

    def mark_down(self, why: str) -> None:
        if self.healthy:
            logger.warning("replica %s is out of rotation: %s", self.url, why)
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.healthy = False
        self.last_error = why
        # What it held is gone with it (a restarted replica starts cold).
        self.prefixes.remove_all()

    def give_up_if_long_down(self) -> None:
        if self.down_since is None or self.gone.is_set():
            return
        if time.monotonic() - self.down_since >= GIVE_UP_S:
            logger.error(
                "replica %s has been down %.0f s: ending the %d requests it holds",
                self.url,
                GIVE_UP_S,
                self.in_flight,
            )
            self.gone.set()

    def mark_up(self) -> None:
        self.healthy = True
        self.last_error = None
        self.down_since = None
        if self.gone.is_set():
            self.gone = asyncio.Event()


class ReplicaSet:
    def __init__(
        self, urls: list[str], api_key: str | None = None, read_timeout_s: float | None = None
    ) -> None:
        """`read_timeout_s`: the longest a replica may go without sending a byte of an
        answer (None: no bound; a stopped replica is still given up on after GIVE_UP_S)."""
        if not urls:
            raise ValueError("a router needs at least one replica")
        self.replicas = [Replica(u.rstrip("/"), i) for i, u in enumerate(urls)]
        # The key for the router's own calls (stats, /version) only: a client's request
        # goes on with the client's own Authorization, never with this one.
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx for the router's own calls (polls, /v1/models, a prefill); the clients'
        # requests go through aiohttp, one connection pool per replica (Replica.session):
        # its C parser relays a stream's bytes at a fraction of httpx's cost per read.
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self.read_timeout_s = read_timeout_s
        self._task: asyncio.Task | None = None

    def _open_sessions(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=self.read_timeout_s
        )
        for r in self.replicas:
            r.session = aiohttp.ClientSession(
                timeout=timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                auto_decompress=False,  # bytes pass through as the replica sent them
            )

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy]

    async def start(self) -> None:
        if self.replicas[0].session is None:
            self._open_sessions()
        await self.poll_all()
        self._task = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.http.aclose()
        for r in self.replicas:
            if r.session is not None:
                await r.session.close()

    async def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.healthy()) < len(self.replicas):
            if time.monotonic() > deadline:
                down = [r.url for r in self.replicas if not r.healthy]
                raise TimeoutError(f"replicas not healthy after {timeout_s:g} s: {down}")
            await asyncio.sleep(0.2)
            await self.poll_all()

    async def poll_all(self) -> None:
        await asyncio.gather(*(self._poll(r) for r in self.replicas))
        for r in self.replicas:
            r.give_up_if_long_down()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self.poll_all()

    async def _poll(self, r: Replica) -> None:
        try:
            health = await self.http.get(r.url + "/health", timeout=POLL_TIMEOUT_S)
            if health.status_code != 200:
                r.mark_down(f"/health answered {health.status_code}")
                return
            stats = await self.http.get(
                r.url + "/v1/engine/stats", headers=self.auth, timeout=POLL_TIMEOUT_S
            )
            if stats.status_code == 200:
                r.stats = stats.json()
                req = r.stats["requests"]
                r.engine_load = req["running"] + req["waiting"]
                r.sent_since_poll = 0
        except (httpx.HTTPError, ValueError, KeyError) as e:
            r.mark_down(f"/health: {type(e).__name__}: {e}")
            return
        if not r.healthy:
            try:
                version = await self.http.get(
                    r.url + "/version", headers=self.auth, timeout=POLL_TIMEOUT_S
                )
                r.info = version.json() if version.status_code == 200 else {}
            except (httpx.HTTPError, ValueError) as e:
                r.mark_down(f"/version: {type(e).__name__}: {e}")
                return
            logger.info("replica %s is in rotation", r.url)
        r.mark_up()
