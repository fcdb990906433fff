"""Running the app under uvicorn with Cadence's own signal handling.

    exit_code = serve(app, host, port, shutdown_timeout, socks)

`socks`: the listening sockets (listener.listening_sockets), taken before the engine
started; host and port only name them in uvicorn's messages.

SIGTERM drains (see api_server.py): no new requests, running ones finish within
`shutdown_timeout` seconds, the rest are aborted, exit code 0. SIGINT (Ctrl-C) aborts what
is running at once and exits. A second signal of either kind exits without waiting.
The exit code is 1 when the engine died (the app sets it), 3 when the server never
started, else 0.

    exit_code = run_app(app, socks)   a plain app (the routers): SIGTERM or SIGINT stops it
                                      and run_app returns, so the caller's cleanup runs
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger("cadence.api")
STARTUP_FAILURE = 3  # (uvicorn's exit code for a server that never started)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.app_state = app.state.cadence
        self.app_state["server"] = self
        self.shutdown_timeout = shutdown_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._signals = 0

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        # uvicorn's own handler would stop listening at once (no 503s for late clients) and
        # re-raise the signal at exit (exit code -15): we drain instead, and exit 0.
        self._signals += 1
        if self._signals > 1 or self.loop is None or not self.started:
            self.should_exit = True
            if self._signals > 2:
                self.force_exit = True
            return
        timeout = self.shutdown_timeout if sig == signal.SIGTERM else 0.0
        logger.info("signal %d: shutting down (grace %.0f s)", sig, timeout)
        self.loop.call_soon_threadsafe(self._start_drain, timeout)

    def _start_drain(self, timeout: float) -> None:
        self._drain_task = asyncio.ensure_future(self.app_state["drain"](timeout))


def serve(
    app: FastAPI,
    host: str,
    port: int,
    shutdown_timeout: float,
    socks: list[socket.socket],
) -> int:
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = _Server(config, app, shutdown_timeout)
    server.run(sockets=socks)
    code = int(app.state.cadence.get("exit_code", 0))  # (1: the engine died, say at start)
    return code if code or server.started else STARTUP_FAILURE


class _AppServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame) -> None:
        # uvicorn's, but without re-raising the signal once the server has stopped: that
        # would end this process before its caller's cleanup (-dp stops its replicas, which
        # drain) could run.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def run_app(app, socks: list[socket.socket]) -> int:
    """A plain ASGI app (the routers) on `socks` until SIGTERM or SIGINT; 0, or
    STARTUP_FAILURE if it never started (as uvicorn.run exits)."""
    server = _AppServer(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=socks)
    return 0 if server.started else STARTUP_FAILURE
