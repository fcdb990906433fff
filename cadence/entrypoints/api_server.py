"""The API server process: FastAPI routes, the guard at the door, the engine's life cycle.

    app = create_app(config, options)   the lifespan starts the engine core process
    serve(app, host, port, t, socks)    uvicorn, with Cadence's signal handling (launcher.py)

With several API processes (--api-server-count, api_servers.py) each runs this app beside an
engine the supervisor started (`attach`), with the admission counts in shared memory.

Life cycle: the lifespan starts the engine and a watcher. If the engine dies (or stalls past
`--engine-stall-timeout`), in-flight requests fail at once, /health turns 503 and, a moment
later, the server exits with code 1 so a supervisor restarts it. SIGTERM drains: new
requests get 503 + Retry-After, running ones get up to `--shutdown-timeout` seconds, what is
left is aborted (finish_reason "abort"), and the server exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import cadence
from cadence.allocator import freeze_startup_objects
from cadence.config import EngineConfig
from cadence.engine.client import AsyncEngineClient, EngineAttachment
from cadence.entrypoints.admission import Admission, SharedCounts
from cadence.entrypoints.engine_view import install_engine_view
from cadence.entrypoints.errors import APIError, install_error_handlers
from cadence.entrypoints.guards import Guard
from cadence.entrypoints.intake import IntakeGate
from cadence.entrypoints.lora_adapters import LoRAAdapters, LoRAModule, install_lora_routes
from cadence.entrypoints.messages_protocol import CountTokensRequest, MessagesRequest
from cadence.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from cadence.entrypoints.prompts import PromptBuilder
from cadence.entrypoints.reasoning import make_reasoning_parser
from cadence.entrypoints.responses_protocol import ResponsesRequest
from cadence.entrypoints.serving_chat import ChatServing
from cadence.entrypoints.serving_completion import CompletionServing
from cadence.entrypoints.serving_embeddings import EmbeddingServing
from cadence.entrypoints.serving_messages import MessagesServing
from cadence.entrypoints.serving_responses import ResponsesServing, ResponseStore
from cadence.entrypoints.streaming import error_events, sse_response, unless_disconnected
from cadence.entrypoints.tool_calls import choose_tool_parser
from cadence.entrypoints.web_ui import install_web_ui
from cadence.kv_transfer.params import TransferAuthority
from cadence.metrics import ServerMetrics
from cadence.multimodal.chat import ImageReader
from cadence.multimodal.media import MediaPolicy
from cadence.multimodal.processor import ImagePrompts
from cadence.tokenizer import load_tokenizer

logger = logging.getLogger("cadence.api")

LOG_EVERY_S = 5.0
DEAD_ENGINE_GRACE_S = 2.0  # after the engine died: time for in-flight errors to go out


@dataclass
class ServerOptions:
    served_model_name: str | None = None
    api_key: str | None = None
    admin_api_key: str | None = None  # the profiler, other users' requests (None: api_key)
    allowed_hosts: frozenset[str] | None = None  # Host header names answered (None: any)
    metrics_public: bool = False  # /metrics without the API key
    max_num_waiting: int = 256  # sequences queued beyond max_num_seqs before 429s
    max_queued_prompt_tokens: int | None = None  # None: 64 x max_model_len
    max_body_bytes: int = 32 * 2**20
    body_timeout_s: float = 60.0  # a request body must arrive within this
    engine_stall_timeout: float = 300.0  # s without engine progress while requests wait
    shutdown_timeout: float = 30.0  # s running requests get to finish on SIGTERM
    responses_store_size: int = 0  # /v1/responses kept for previous_response_id (0: none)
    reasoning_parser: str | None = None  # thinking apart from the answer (entrypoints/reasoning)
    tool_call_parser: str = "auto"  # the format tool calls are read in (entrypoints/tool_parsers)
    lora_modules: tuple[LoRAModule, ...] = ()  # adapters served by name from the start
    api_server_count: int = 1  # API processes serving this engine (api_servers.py)
    allowed_media_domains: tuple[str, ...] = ()  # hosts whose image URLs are fetched


def create_app(
    config: EngineConfig,
    options: ServerOptions | None = None,
    attach: EngineAttachment | None = None,
    counts: SharedCounts | None = None,
) -> FastAPI:
    """`attach`: the engine core another process started (None: this app starts its own);
    `counts`: the admission counts shared by the API processes."""
    opts = options or ServerOptions()
    lead = attach is None or attach.client_index == 0  # records the engine's stats
    state: dict = {"draining": False, "exit_code": 0, "api_server_count": opts.api_server_count}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from cadence.loader.model_path import resolve_model_path

        # Resolve (and convert a GGUF) here once, so the engine process loads a folder.
        path = await asyncio.to_thread(resolve_model_path, config.model.model)
        name = opts.served_model_name or (config.model.model or "SmolLM2-135M-Instruct")
        config.model.model = path
        tokenizer = None
        if not config.model.skip_tokenizer_init:
            tokenizer = await asyncio.to_thread(load_tokenizer, config.model.tokenizer or path)
        metrics = ServerMetrics(name, lead=lead)
        client = AsyncEngineClient(
            config, tokenizer, metrics, stall_timeout=opts.engine_stall_timeout, attach=attach
        )
        client.on_stats = metrics.update_engine_stats
        ready = await client.start()
        admission = Admission(
            config.scheduler.max_num_seqs,
            opts.max_num_waiting,
            opts.max_queued_prompt_tokens or 64 * ready.max_model_len,
            on_reject=lambda: metrics.rejected.labels(name).inc(),
            counts=counts,
        )
        images = None
        if ready.image_token_id is not None and tokenizer is not None:
            processor = await asyncio.to_thread(ImagePrompts.for_model, path, ready.pixel_dtype)
            policy = MediaPolicy(opts.allowed_media_domains)
            images = ImageReader(processor, policy, config.model.images_per_prompt())
        prompts = await asyncio.to_thread(
            PromptBuilder, tokenizer, ready.max_model_len, images=images
        )
        transfers = TransferAuthority(config.kv_transfer_secret)
        adapters = LoRAAdapters(client, name)
        for module in opts.lora_modules:  # (a bad folder stops the start, naming why)
            await adapters.load(module.name, module.path, module.base_model_name)
        shared = (client, prompts, name, ready.max_model_len, admission, transfers, adapters)
        reasoning = opts.reasoning_parser
        chat = ChatServing(
            *shared,
            reasoning=make_reasoning_parser(reasoning) if reasoning else None,
            tool_parser=choose_tool_parser(opts.tool_call_parser, tokenizer),
        )
        store = ResponseStore(opts.responses_store_size) if opts.responses_store_size else None
        state.update(
            client=client,
            metrics=metrics,
            name=name,
            prompts=prompts,
            admission=admission,
            adapters=adapters,
            completions=CompletionServing(*shared),
            embeddings=EmbeddingServing(*shared),
            chat=chat,
            responses=ResponsesServing(chat, store),
            messages=MessagesServing(chat),
            ready=ready,
            started=time.time(),
            speculative=config.speculative is not None,
        )
        logger.info(
            "serving %s (max_model_len %d, %d KV blocks)",
            name,
            ready.max_model_len,
            ready.num_blocks,
        )
        freeze_startup_objects()
        tasks = [asyncio.create_task(_exit_when_engine_dies(client, state))]
        if lead:
            tasks.append(asyncio.create_task(_log_stats(client, metrics)))
        try:
            yield
        finally:
            gc.unfreeze()  # (an app served in a test process: its objects may go now)
            for t in tasks:
                t.cancel()
            prompts.shutdown()
            await client.shutdown()

    app = FastAPI(title="Cadence", version=cadence.__version__, lifespan=lifespan)
    app.state.cadence = state
    install_error_handlers(app)
    app.add_middleware(IntakeGate, draining=lambda: state["draining"])  # (inside the guard)
    app.add_middleware(
        Guard,
        api_key=opts.api_key or os.environ.get("CADENCE_API_KEY"),
        admin_key=opts.admin_api_key or os.environ.get("CADENCE_ADMIN_API_KEY"),
        allowed_hosts=opts.allowed_hosts,
        metrics_public=opts.metrics_public,
        max_body_bytes=opts.max_body_bytes,
        body_timeout_s=opts.body_timeout_s,
        draining=lambda: state["draining"],
    )

    async def drain(timeout_s: float) -> None:
        """Stop admitting, give running requests `timeout_s`, abort the rest, then exit."""
        state["draining"] = True
        admission: Admission | None = state.get("admission")
        client: AsyncEngineClient | None = state.get("client")
        if admission is not None and client is not None:
            logger.info(
                "draining: %d sequences in flight, up to %.0f s", admission.own_seqs, timeout_s
            )
            deadline = time.monotonic() + timeout_s
            while not admission.idle and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if not admission.idle:
                logger.warning("drain timed out: aborting %d sequences", admission.own_seqs)
                await client.abort_all()
                deadline = time.monotonic() + 2.0  # let their last chunks go out
                while not admission.idle and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        server = state.get("server")
        if server is not None:
            server.should_exit = True

    state["drain"] = drain
    install_web_ui(app)
    install_engine_view(app, state)
    install_lora_routes(app, state)

    # ---- routes -----------------------------------------------------------------------

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        serving: CompletionServing = state["completions"]
        if req.stream:
            return await sse_response(await serving.completions(req))
        return await unless_disconnected(serving.completions(req), request)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        serving: ChatServing = state["chat"]
        if req.stream:
            return await sse_response(await serving.chat(req))
        return await unless_disconnected(serving.chat(req), request)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request):
        serving: EmbeddingServing = state["embeddings"]
        return await unless_disconnected(serving.embed(req), request)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        serving: ResponsesServing = state["responses"]
        if req.stream:
            return await sse_response(await serving.create(req), error_events("/v1/responses"))
        return await unless_disconnected(serving.create(req), request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        serving: ResponsesServing = state["responses"]
        return JSONResponse(serving.retrieve(response_id))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        serving: ResponsesServing = state["responses"]
        serving.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/messages")
    async def messages(req: MessagesRequest, request: Request):
        serving: MessagesServing = state["messages"]
        if req.stream:
            return await sse_response(await serving.create(req), error_events("/v1/messages"))
        return await unless_disconnected(serving.create(req), request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        serving: MessagesServing = state["messages"]
        return await serving.count_tokens(req)

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
                },
                *state["adapters"].cards(state["ready"].max_model_len),
            ],
        }

    @app.get("/health")
    async def health():
        client: AsyncEngineClient = state["client"]
        if not client.healthy:
            reason = client.dead_reason or "engine not running"
            return APIError(reason, 503, "service_unavailable").response()
        if state["draining"]:
            return APIError("shutting down", 503, "service_unavailable").response()
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        cache = config.cache
        return {
            "version": cadence.__version__,
            "model": state.get("name"),
            "prefix_cache": cache.prefix_cache if cache.enable_prefix_caching else "off",
            "scheduling_policy": config.scheduler.scheduling_policy,
            "speculative_config": None
            if config.speculative is None
            else dataclasses.asdict(config.speculative),
            "lora": {"max_loras": config.lora.max_loras, "max_lora_rank": config.lora.max_lora_rank}
            if config.lora.enable_lora
            else None,
            "kv_transfer": None
            if config.kv_role is None
            else {"role": config.kv_role, "addr": state["ready"].kv_transfer_addr},
        }

    @app.get("/metrics")
    async def metrics():
        return Response(
            state["metrics"].render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        serving: ChatServing = state["chat"]
        serving.check_model(req.model)
        prompts: PromptBuilder = state["prompts"]
        if req.messages is not None:
            ids, _ = await prompts.chat(
                req.messages, req.add_generation_prompt, kwargs=req.chat_template_kwargs
            )
        elif req.prompt is not None:
            ids = await prompts.encode(req.prompt, req.add_special_tokens) if req.prompt else []
        else:
            raise APIError("give prompt or messages", param="prompt")
        # JSONResponse directly: FastAPI's jsonable_encoder walks a long id list in Python on
        # the event loop (seconds for a few MB of prompt), stalling everyone else.
        return JSONResponse(
            {"tokens": ids, "count": len(ids), "max_model_len": serving.max_model_len}
        )

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        serving: ChatServing = state["chat"]
        serving.check_model(req.model)
        serving.check_ids(req.tokens, "tokens")
        return JSONResponse({"prompt": await state["prompts"].decode(req.tokens)})

    return app


async def _exit_when_engine_dies(client: AsyncEngineClient, state: dict) -> None:
    """A dead or wedged engine is not recovered in place: fail fast, exit 1, and let the
    supervisor (systemd, Kubernetes, ...) start a fresh server."""
    await client.dead_event.wait()
    state["exit_code"] = 1
    logger.error("engine is gone (%s); the server exits", client.dead_reason)
    await asyncio.sleep(DEAD_ENGINE_GRACE_S)
    server = state.get("server")
    if server is not None:
        server.should_exit = True


async def _log_stats(client: AsyncEngineClient, metrics: ServerMetrics) -> None:
    """A line every few seconds while busy: throughput, running / waiting, KV usage (the
    whole server's: every API process's tokens)."""

    def tokens() -> tuple[float, float]:
        m = metrics.samples()
        return m.get("cadence:generation_tokens_total", 0), m.get("cadence:prompt_tokens_total", 0)

    (last_gen, last_prompt), last_t = tokens(), time.monotonic()
    while True:
        await asyncio.sleep(LOG_EVERY_S)
        (g, p), t = tokens(), time.monotonic()
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
