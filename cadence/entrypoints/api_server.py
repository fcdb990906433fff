"""The API server process: FastAPI routes, errors as OpenAI error objects, auth, metrics.

create_app(args) -> FastAPI       the lifespan starts the engine core process
run_server(args)                  uvicorn on --host/--port (127.0.0.1 by default)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

import cadence
from cadence.config import EngineConfig
from cadence.engine.client import AsyncEngineClient, EngineDeadError
from cadence.entrypoints.admission import Admission, QueueFull
from cadence.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from cadence.entrypoints.serving import APIError, Serving
from cadence.metrics import ServerMetrics
from cadence.tokenizer import load_tokenizer

logger = logging.getLogger("cadence.api")

MAX_BODY_BYTES = 32 * 2**20
LOG_EVERY_S = 5.0


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(
    config: EngineConfig,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_num_waiting: int = 256,
    max_queued_prompt_tokens: int | None = None,
) -> FastAPI:
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from cadence.loader.loader import resolve_model_path

        # Resolve (and convert a GGUF) here once, so the engine process loads a folder.
        path = await asyncio.to_thread(resolve_model_path, config.model.model)
        name = served_model_name or (config.model.model or "SmolLM2-135M-Instruct")
        config.model.model = path
        tokenizer = None
        if not config.model.skip_tokenizer_init:
            tokenizer = await asyncio.to_thread(load_tokenizer, config.model.tokenizer or path)
        metrics = ServerMetrics(name)
        client = AsyncEngineClient(config, tokenizer, metrics)
        client.on_stats = metrics.update_engine_stats
        ready = await client.start()
        queued_tokens = max_queued_prompt_tokens or 64 * ready.max_model_len
        admission = Admission(
            config.scheduler.max_num_seqs,
            max_num_waiting,
            queued_tokens,
            on_reject=lambda: metrics.rejected.labels(name).inc(),
        )
        state.update(
            client=client,
            metrics=metrics,
            name=name,
            tokenizer=tokenizer,
            serving=Serving(client, tokenizer, name, ready.max_model_len, admission),
            ready=ready,
            started=time.time(),
        )
        logger.info(
            "serving %s (max_model_len %d, %d KV blocks)",
            name,
            ready.max_model_len,
            ready.num_blocks,
        )
        log_task = asyncio.create_task(_log_stats(client, metrics, name))
        try:
            yield
        finally:
            log_task.cancel()
            await client.shutdown()

    app = FastAPI(title="Cadence", version=cadence.__version__, lifespan=lifespan)
    app.state.cadence = state

    # ---- errors -----------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return _error(
                APIError(f"malformed JSON body: {first.get('ctx', {}).get('error', '')}".strip())
            )
        loc = [str(x) for x in first.get("loc", []) if x != "body"]
        msg = "; ".join(
            f"{'.'.join(str(x) for x in err.get('loc', []) if x != 'body')}: {err.get('msg')}"
            for err in errs[:5]
        )
        return _error(APIError(msg or "invalid request", param=".".join(loc) or None))

    @app.exception_handler(QueueFull)
    async def _queue_full(_: Request, e: QueueFull):
        return _error(
            APIError(
                str(e), 429, "rate_limit_exceeded", headers={"Retry-After": str(e.retry_after)}
            )
        )

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, e: EngineDeadError):
        return _error(APIError(str(e), 503, "service_unavailable"))

    @app.exception_handler(ValueError)
    async def _value(_: Request, e: ValueError):
        return _error(APIError(str(e)))

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception):
        logger.exception("internal error")
        return _error(APIError(f"internal error: {type(e).__name__}", 500, "internal_error"))

    # ---- middleware: body size, auth ------------------------------------------------------

    key = api_key or os.environ.get("CADENCE_API_KEY")

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            return _error(
                APIError(f"request body over {MAX_BODY_BYTES} bytes", 413, code="body_too_large")
            )
        if key and request.url.path.startswith("/v1"):
            auth = request.headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), key.encode()):
                return _error(
                    APIError(
                        "invalid or missing API key",
                        401,
                        "authentication_error",
                        code="invalid_api_key",
                    )
                )
        return await call_next(request)

    # ---- routes -----------------------------------------------------------------------

    def serving() -> Serving:
        return state["serving"]

    async def respond(result, request: Request):
        if not hasattr(result, "__aiter__"):
            return JSONResponse(result)
        # Start the stream before answering, so errors at submission (429, 400) are status codes.
        first = await anext(result, None)

        async def body():
            try:
                if first is not None:
                    yield first
                async for chunk in result:
                    yield chunk
            except (EngineDeadError, ValueError) as e:
                err = APIError(str(e), 503 if isinstance(e, EngineDeadError) else 400)
                yield f"data: {json.dumps(err.body())}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                await result.aclose()  # a hang-up lands here: aborts the request in the core

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def run_unless_disconnected(coro, request: Request):
        """Non-streaming: if the client hangs up, cancel (and so abort) the request."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if not done and await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
        return task.result()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        if req.stream:
            return await respond(await serving().completions(req), request)
        result = await run_unless_disconnected(serving().completions(req), request)
        return result if isinstance(result, Response) else JSONResponse(result)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        if req.stream:
            return await respond(await serving().chat(req), request)
        result = await run_unless_disconnected(serving().chat(req), request)
        return result if isinstance(result, Response) else JSONResponse(result)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": state["name"],
                    "object": "model",
                    "created": int(state["started"]),
                    "owned_by": "cadence",
                    "root": state["ready"].model_path,
                    "max_model_len": state["ready"].max_model_len,
                }
            ],
        }

    @app.get("/health")
    async def health():
        client: AsyncEngineClient = state["client"]
        if not client.healthy:
            return _error(
                APIError(client.dead_reason or "engine not running", 503, "service_unavailable")
            )
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        cache = config.cache
        return {
            "version": cadence.__version__,
            "model": state.get("name"),
            "prefix_cache": cache.prefix_cache if cache.enable_prefix_caching else "off",
            "scheduling_policy": config.scheduler.scheduling_policy,
        }

    @app.get("/metrics")
    async def metrics():
        return Response(
            state["metrics"].render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        s = serving()
        s.check_model(req.model)
        if req.messages is not None:
            ids = s.chat_prompt(req.messages, req.add_generation_prompt)
        elif req.prompt is not None:
            ids = s.encode(req.prompt, req.add_special_tokens) if req.prompt else []
        else:
            raise APIError("give prompt or messages", param="prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": s.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        s = serving()
        s.check_model(req.model)
        s._check_ids(req.tokens)
        return {"prompt": s._decode(req.tokens)}

    return app


async def _log_stats(client: AsyncEngineClient, metrics: ServerMetrics, name: str) -> None:
    """A line every few seconds while busy: throughput, running / waiting, KV usage."""
    gen = metrics.generation_tokens.labels(name)
    prompt = metrics.prompt_tokens.labels(name)
    last_gen, last_prompt, last_t = gen._value.get(), prompt._value.get(), time.monotonic()
    while True:
        await asyncio.sleep(LOG_EVERY_S)
        g, p, t = gen._value.get(), prompt._value.get(), time.monotonic()
        s = client.stats
        if g != last_gen or p != last_prompt or s.num_running or s.num_waiting:
            dt = t - last_t
            logger.info(
                "prompt throughput %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, KV usage %.1f%%, prefix hit rate %.1f%%",
                (p - last_prompt) / dt,
                (g - last_gen) / dt,
                s.num_running,
                s.num_waiting,
                100 * s.kv_usage,
                100 * s.prefix_hits / max(1, s.prefix_queries),
            )
        last_gen, last_prompt, last_t = g, p, t
