"""The door of the API server: one pure ASGI middleware that every HTTP request passes.

In order, before any route runs:
  1. the Host header: with an allowlist (`--allowed-hosts`; by default the loopback names
     when the server is bound to loopback), any other host is a 400. A web page from
     elsewhere whose name was re-pointed at 127.0.0.1 (DNS rebinding) cannot reach the API;
  2. draining (SIGTERM received): 503 + Retry-After for everything but /health and /metrics;
  3. the keys: with `--api-key`, every path but /health, the web app's page and assets
     (/, /ui/...), and /metrics with `--metrics-public` needs `Authorization: Bearer KEY`
     (or Anthropic clients' `x-api-key: KEY`), compared in constant time (the admin key
     is taken too). The admin paths (the profiler, loading LoRA adapters) need the admin key (`--admin-api-key`;
     without one, the API key). Whether the caller holds the admin key is left in
     `scope["state"]["admin"]` for the routes;
  4. the body: a declared Content-Length over the limit is a 413 before a byte is read;
     otherwise the body is read here, counting bytes as they arrive (so a chunked upload
     with no Content-Length is cut off at the limit too), within a time bound (408), and
     replayed to the route. After the body, the route's `receive` still reports the
     client's hang-up (`http.disconnect`), which is how aborts on disconnect work;
  5. a POST whose Content-Type is given and is not JSON: 415.

Pure ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware wraps the
route's `receive`, and a non-streamed route then never learns that its client left.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.web_ui import is_public

Scope = dict
Message = dict

PUBLIC_PATHS = frozenset({"/health"})
ADMIN_PATHS = frozenset(
    {"/start_profile", "/stop_profile", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def default_allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """The Host names a server bound to `bind_host` answers by default: the loopback names
    when it listens on loopback only, any otherwise (None)."""
    loopback = bind_host in LOOPBACK_HOSTS or bind_host.startswith("127.")
    return LOOPBACK_HOSTS | {bind_host} if loopback else None


def parse_allowed_hosts(text: str | None, bind_host: str) -> frozenset[str] | None:
    """--allowed-hosts ("a.example,b.example", "*" for any; None: the default)."""
    if text is None:
        return default_allowed_hosts(bind_host)
    names = {h.strip().lower() for h in text.split(",") if h.strip()}
    return None if "*" in names else frozenset(names)


def _digest(key: str | None) -> bytes | None:
    return hashlib.sha256(key.encode()).digest() if key else None


class Guard:
    def __init__(
        self,
        app,
        *,
        api_key: str | None,
        metrics_public: bool,
        max_body_bytes: int,
        body_timeout_s: float,
        draining: Callable[[], bool],
        admin_key: str | None = None,
        allowed_hosts: frozenset[str] | None = None,
    ) -> None:
        self.app = app
        # Digests of equal length: compare_digest then takes the same time for any key.
        self.key_digest = _digest(api_key)
        self.admin_digest = _digest(admin_key or api_key)
        self.allowed_hosts = allowed_hosts
        self.public = PUBLIC_PATHS | ({"/metrics"} if metrics_public else set())
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.draining = draining

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = _headers(scope)
        if not self._host_allowed(headers.get("host")):
            err = APIError(
                "the Host header names a host this server does not answer for (--allowed-hosts)",
                400,
                code="host_not_allowed",
            )
            return await reply_error(err, scope, receive, send)
        if self.draining() and path not in ("/health", "/metrics"):
            return await reply_error(shutting_down(), scope, receive, send)
        token = _bearer(headers)
        admin = self.admin_digest is None or _holds(token, self.admin_digest)
        user = admin or self.key_digest is None or _holds(token, self.key_digest)
        scope.setdefault("state", {})["admin"] = admin
        if not user and path not in self.public and not is_public(path):
            err = APIError(
                "invalid or missing API key",
                401,
                "authentication_error",
                code="invalid_api_key",
            )
            return await reply_error(err, scope, receive, send, {"WWW-Authenticate": "Bearer"})
        if path in ADMIN_PATHS and not admin:
            err = APIError(
                "this endpoint needs the admin API key", 403, "permission_error", code="admin_only"
            )
            return await reply_error(err, scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await reply_error(self._too_large(), scope, receive, send)
        if scope["method"] == "POST":
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and ctype != "application/json" and not ctype.endswith("+json"):
                err = APIError(
                    f"Content-Type {ctype!r} is not supported: send application/json",
                    415,
                    code="unsupported_media_type",
                )
                return await reply_error(err, scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.body_timeout_s)
        except TimeoutError:
            err = APIError(
                f"the request body did not arrive within {self.body_timeout_s:g} s",
                408,
                "timeout_error",
                code="request_timeout",
            )
            return await reply_error(err, scope, receive, send, {"Connection": "close"})
        except _Disconnected:
            return
        if body is None:
            return await reply_error(
                self._too_large(), scope, receive, send, {"Connection": "close"}
            )
        await self.app(scope, _replay(body, receive), send)

    def _host_allowed(self, host: str | None) -> bool:
        if self.allowed_hosts is None or host is None:  # (no Host: not from a browser)
            return True
        host = host.strip().lower()
        if host.startswith("["):  # [::1]:8000
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return name in self.allowed_hosts

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _too_large(self) -> APIError:
        return APIError(
            f"the request body is over {self.max_body_bytes} bytes",
            413,
            code="body_too_large",
        )


class _Disconnected(Exception):
    pass


def _bearer(headers: dict[str, str]) -> str:
    """The key a client presents: `Authorization: Bearer KEY`, or Anthropic's
    `x-api-key: KEY`."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:]
    return headers.get("x-api-key", "")


def _holds(token: str, digest: bytes) -> bool:
    return hmac.compare_digest(hashlib.sha256(token.encode()).digest(), digest)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _replay(body: bytes, receive):
    """A `receive` that hands the route the body once, then passes through (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def shutting_down() -> APIError:
    return APIError(
        "the server is shutting down; retry on another replica or later",
        503,
        "service_unavailable",
        headers={"Retry-After": "5"},
    )


async def reply_error(
    err: APIError, scope: Scope, receive, send, extra: dict | None = None
) -> None:
    response = err.response(scope["path"])
    for k, v in (extra or {}).items():
        response.headers[k] = v
    await response(scope, receive, send)
