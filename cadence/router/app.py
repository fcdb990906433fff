"""The router's HTTP side: one OpenAI-compatible address in front of several replicas.

    POST /v1/completions, /v1/chat/completions   routed (policies.py), body passed through,
         /v1/responses, /v1/messages,            SSE streamed through as it arrives (aiohttp,
                                                 one connection pool per replica)
         /v1/embeddings
                                                 (disaggregated prefill: completions and
                                                 chat only)
    GET  /v1/models                              a healthy replica's answer
    GET  /health                                 200 while any replica is in rotation
    GET  /metrics                                the router's own counters (cadence:router_*),
                                                 then the replicas' series (views.py)
    GET  /v1/engine/*, /, /ui/...                the replicas' engine view and the web app
    GET  /v1/router/replicas                     each replica: health, load, index size

The door is the API server's (entrypoints/guards.py): with `--api-key` every route but
/health needs the key, checked before a body byte is read; bodies are capped in size and
time; the Host header is checked. The client's Authorization header goes to the replica as
it came (replicas share a key); a client's `kv_transfer_params` never does (the router
signs its own: disagg.py).

A replica that cannot be reached before it answered is taken out of rotation and the
request goes to another; one that fails mid-answer, or stops answering for GIVE_UP_S, ends
that answer with an error (an SSE error event and [DONE] on a stream, 502 otherwise): the
router never retries a request that may already have produced tokens, and nothing hangs. A
client that hangs up, streamed or not, ends its request on the replica too (relay.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.guards import Guard
from cadence.router.disagg import prefill_remotely
from cadence.router.policies import Choice, make_policy
from cadence.router.prefix_index import chunk_keys
from cadence.router.relay import ClientGone, ReplicaGone, relay, until_stopped
from cadence.router.replicas import ReplicaSet
from cadence.router.views import install_replica_views

logger = logging.getLogger("cadence.router")

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


@dataclass
class RouterOptions:
    api_key: str | None = None  # clients' key, also the router's own polls of the replicas
    kv_transfer_secret: str | None = None  # signs kv_transfer_params (--prefill: required)
    allowed_hosts: frozenset[str] | None = None  # Host header names answered (None: any)
    metrics_public: bool = False  # /metrics without the key
    max_body_bytes: int = 32 * 2**20
    body_timeout_s: float = 60.0  # a request body must arrive within this
    replica_timeout_s: float | None = 600.0  # longest silence of a replica mid-answer


def error(
    message: str, status: int, kind: str = "service_unavailable", path: str = ""
) -> JSONResponse:
    """The router's own error answer, in the shape of the API at `path`."""
    return APIError(message, status, kind).response(path)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "cadence:router_requests", "Requests routed, per replica", ["replica"], registry=r
        )
        self.decisions = Counter(
            "cadence:router_decisions",
            "Routing decisions by reason (cache_hit, no_match, balance, least_load, round_robin)",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "cadence:router_prompt_tokens",
            "Prompt tokens routed (the router's own tokenization), per replica",
            ["replica"],
            registry=r,
        )
        self.hit_tokens = Counter(
            "cadence:router_estimated_hit_tokens",
            "Of those, tokens the replica was sent before (its prefix index): estimated hits",
            ["replica"],
            registry=r,
        )
        self.errors = Counter(
            "cadence:router_errors",
            "Requests that failed at a replica: unreachable (retried elsewhere) or broken "
            "mid-answer",
            ["replica", "kind"],
            registry=r,
        )
        self.healthy = Gauge(
            "cadence:router_replica_healthy", "1 while in rotation", ["replica"], registry=r
        )
        self.load = Gauge(
            "cadence:router_replica_load",
            "Sequences the replica holds (estimate)",
            ["replica"],
            registry=r,
        )


def _text_of(content) -> str:
    """A message's text: a string, or the text of a list of parts / blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _conversation(head: str, messages) -> str:
    parts = [head] if head else []
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            parts.append(f"{m.get('role')}: {_text_of(m.get('content'))}")
    return "\n".join(parts)


def prompt_text(path: str, body: dict) -> str | list[int]:
    """What the routing key is made of: the (first) prompt, or the conversation rendered
    plainly. Whatever shape a client sent, this returns a key (the replica judges it)."""
    if path.endswith("/chat/completions"):
        return _conversation("", body.get("messages"))
    if path.endswith(("/messages", "/messages/count_tokens")):
        return _conversation(_text_of(body.get("system")), body.get("messages"))
    if path.endswith("/responses"):
        items = body.get("input")
        if not isinstance(items, list):
            items = [{"role": "user", "content": items}]
        return _conversation(_text_of(body.get("instructions")), items)
    prompt = body.get("input" if path.endswith("/embeddings") else "prompt", "")
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return prompt
        prompt = prompt[0]
    return prompt if isinstance(prompt, (str, list)) else ""


def create_router_app(
    urls: list[str],
    policy: str = "cache-aware",
    tokenizer=None,
    startup_timeout_s: float = 0.0,
    prefill_urls: list[str] | None = None,
    options: RouterOptions | None = None,
    **policy_kw,
) -> FastAPI:
    """`urls`: the replicas that answer (with `prefill_urls`, the decode engines of a
    disaggregated deployment: disagg.py). `tokenizer`: encodes prompt text for the prefix
    indexes (None: 4 bytes a token, a rough stand-in that still groups equal prefixes)."""
    opts = options or RouterOptions()
    if prefill_urls and not opts.kv_transfer_secret:
        raise ValueError("disaggregated serving (--prefill) needs the deployment's secret")
    choosers = {
        "decode": make_policy(policy, **policy_kw),
        "prefill": make_policy(policy, **policy_kw),
    }
    metrics = RouterMetrics()
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sets = {"decode": ReplicaSet(urls, opts.api_key, opts.replica_timeout_s)}
        if prefill_urls:
            sets["prefill"] = ReplicaSet(prefill_urls, opts.api_key, opts.replica_timeout_s)
        state["replicas"] = sets["decode"]
        state["prefill"] = sets.get("prefill")
        for replicas in sets.values():
            if startup_timeout_s:
                await replicas.wait_healthy(startup_timeout_s)
            await replicas.start()
        what = f"{len(prefill_urls)} prefill + {len(urls)} decode" if prefill_urls else len(urls)
        logger.info("routing %s over %s replicas", policy, what)
        try:
            yield
        finally:
            for replicas in sets.values():
                await replicas.close()

    app = FastAPI(title="Cadence router", lifespan=lifespan)
    app.add_middleware(
        Guard,
        api_key=opts.api_key,
        allowed_hosts=opts.allowed_hosts,
        metrics_public=opts.metrics_public,
        max_body_bytes=opts.max_body_bytes,
        body_timeout_s=opts.body_timeout_s,
        draining=lambda: False,
    )

    def keys_for(path: str, body: dict) -> tuple[list[bytes], int]:
        text = prompt_text(path, body)
        if isinstance(text, list):
            ids = text
        elif tokenizer is not None:
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            raw = text.encode(errors="replace")
            ids = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]
        return chunk_keys(ids), len(ids)

    def route(
        keys: list[bytes], num_tokens: int, exclude: set[int], role: str = "decode"
    ) -> Choice | None:
        rset = state["replicas"] if role == "decode" else state["prefill"]
        replicas = [r for r in rset.healthy() if r.index not in exclude]
        if not replicas:
            return None
        choice = choosers[role].choose(replicas, keys)
        r = choice.replica
        r.prefixes.insert(keys)
        metrics.requests.labels(r.url).inc()
        metrics.decisions.labels(choice.reason).inc()
        metrics.prompt_tokens.labels(r.url).inc(num_tokens)
        metrics.hit_tokens.labels(r.url).inc(min(choice.matched_tokens, num_tokens))
        return choice

    async def forward(request: Request, path: str):
        raw = await request.body()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except (ValueError, RecursionError) as e:  # (RecursionError: nested too deep)
            why = f"invalid JSON body: {type(e).__name__}: {e}"[:300]
            return error(why, 400, "invalid_request_error", path)
        if body.pop("kv_transfer_params", None) is not None:  # the router's own field
            raw = json.dumps(body).encode()
        keys, num_tokens = await asyncio.to_thread(keys_for, path, body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers["content-type"] = "application/json"
        if state["prefill"] is not None and path in DISAGG_PATHS and _single_prompt(body):

            def route_prefill(tried: set[int]):
                choice = route(keys, num_tokens, tried, "prefill")
                return choice.replica if choice else None

            try:
                params, failed = await prefill_remotely(
                    state["prefill"],
                    route_prefill,
                    path,
                    body,
                    headers,
                    metrics,
                    opts.kv_transfer_secret,
                    lambda work, r: until_stopped(work, request, r),
                )
            except ClientGone:
                return Response(status_code=499)
            if failed is not None:
                return failed
            if params is not None:
                body["kv_transfer_params"] = params
                raw = json.dumps(body).encode()
        tried: set[int] = set()
        while True:
            choice = route(keys, num_tokens, tried)
            if choice is None:
                return error("no replica is available", 503, path=path)
            r = choice.replica
            tried.add(r.index)
            r.in_flight += 1
            r.sent_since_poll += 1
            try:
                upstream = r.session.post(r.url + path, data=raw, headers=headers)
                resp = await until_stopped(upstream, request, r)
            except aiohttp.ConnectionTimeoutError as e:  # never reached: go elsewhere
                r.in_flight -= 1
                metrics.errors.labels(r.url, "unreachable").inc()
                r.mark_down(f"{type(e).__name__}: {e}")
                continue
            except TimeoutError as e:  # taken, never answered (aiohttp's timeouts are these)
                r.in_flight -= 1
                metrics.errors.labels(r.url, "timeout").inc()
                r.mark_down(f"{type(e).__name__}: {e}")
                return error(f"replica {r.url} did not answer in time", 504, "timeout_error", path)
            except aiohttp.ClientError as e:  # nothing was sent back: safe to go elsewhere
                r.in_flight -= 1
                metrics.errors.labels(r.url, "unreachable").inc()
                r.mark_down(f"{type(e).__name__}: {e}")
                continue
            except ClientGone:
                r.in_flight -= 1
                return Response(status_code=499)
            except ReplicaGone:
                r.in_flight -= 1
                metrics.errors.labels(r.url, "gone").inc()
                return error(f"replica {r.url} stopped answering", 502, path=path)
            break
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(
                relay(resp, r, metrics, path), status_code=resp.status, headers=out_headers
            )
        try:
            content = await until_stopped(resp.read(), request, r)
        except ClientGone:
            return Response(status_code=499)
        except (aiohttp.ClientError, TimeoutError, ReplicaGone) as e:
            metrics.errors.labels(r.url, "broken").inc()
            r.mark_down(f"{type(e).__name__}: {e}")
            why = f"replica {r.url} failed while answering: {type(e).__name__}"
            return error(why, 502, path=path)
        finally:
            r.in_flight -= 1
            resp.release()
        return Response(content, status_code=resp.status, headers=out_headers)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await forward(request, "/v1/chat/completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await forward(request, "/v1/embeddings")

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await forward(request, "/v1/responses")

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await forward(request, "/v1/messages")

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        return await forward(request, "/v1/messages/count_tokens")

    @app.get("/v1/models")
    async def models(request: Request):
        replicas: ReplicaSet = state["replicas"]
        auth = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        for r in replicas.healthy():
            try:
                resp = await replicas.http.get(r.url + "/v1/models", headers=auth)
            except httpx.HTTPError:
                continue
            return Response(resp.content, resp.status_code, media_type="application/json")
        return error("no replica is available", 503)

    @app.get("/health")
    async def health():
        if state["replicas"].healthy():
            return Response(status_code=200)
        return error("no replica is in rotation", 503)

    @app.get("/v1/router/replicas")
    async def replica_status():
        prefill = state["prefill"].replicas if state["prefill"] is not None else []
        return {
            "policy": policy,
            "prefill": [
                {"url": r.url, "healthy": r.healthy, "load": r.load, "in_flight": r.in_flight}
                for r in prefill
            ],
            "replicas": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "load": r.load,
                    "in_flight": r.in_flight,
                    "indexed_chunks": len(r.prefixes),
                    "last_error": r.last_error,
                }
                for r in state["replicas"].replicas
            ],
        }

    def router_metrics() -> bytes:
        for r in state["replicas"].replicas:
            metrics.healthy.labels(r.url).set(1 if r.healthy else 0)
            metrics.load.labels(r.url).set(r.load)
        return generate_latest(metrics.registry)

    install_replica_views(app, state, router_metrics)  # /metrics, /v1/engine/*, the web app

    app.state.router = state
    return app


# Where a prefill server may take the prompt first: the APIs whose max_tokens and prompt
# fields disagg.py knows.
DISAGG_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def _single_prompt(body: dict) -> bool:
    """One prompt (a transfer carries one prompt's K/V): chat, a string, or one id list."""
    prompt = body.get("prompt")
    if "messages" in body or isinstance(prompt, str):
        return True
    return isinstance(prompt, list) and (
        all(isinstance(t, int) for t in prompt) or len(prompt) == 1
    )
