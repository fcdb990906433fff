"""What the engine is doing, over HTTP: the data behind the web UI's engine view.

    GET  /v1/engine/stats      queues, KV pool, prefix cache, token and request counters
                               (cumulative: a client takes rates from two readings)
    GET  /v1/engine/steps      the step timeline: ?since=STEP_ID&limit=N (newest N)
    GET  /v1/engine/requests   the requests the engine holds: state, tokens, cache hits, age
                               (their ids only to the admin key's holder: other users'
                               request ids are theirs)
    POST /start_profile        torch.profiler in the engine process (needs --profile-dir;
    POST /stop_profile         the admin key): ... stopped; the trace's path in the answer

Protected like /v1 (the API key). Counters come from the same objects /metrics renders,
so the two always agree; queue and KV numbers are the engine's last report (sent with every
step's outputs).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from cadence.engine.client import AsyncEngineClient, EngineCallError, EngineDeadError
from cadence.entrypoints.errors import APIError

CALL_TIMEOUT_S = 10.0
PROFILE_STOP_TIMEOUT_S = 300.0  # writing a long trace takes a while
MAX_STEPS = 100_000


def install_engine_view(app: FastAPI, state: dict) -> None:
    router = APIRouter()

    async def call(method: str, timeout: float = CALL_TIMEOUT_S, **args):
        client: AsyncEngineClient = state["client"]
        try:
            return await client.call(method, timeout, **args)
        except EngineCallError as e:
            raise APIError(str(e)) from None
        except EngineDeadError as e:
            raise APIError(str(e), 503, "service_unavailable") from None
        except TimeoutError:
            raise APIError(
                f"the engine did not answer within {timeout:g} s", 503, "service_unavailable"
            ) from None

    @router.get("/v1/engine/stats")
    async def stats():
        return JSONResponse(engine_stats(state))

    @router.get("/v1/engine/steps")
    async def steps(since: int = 0, limit: int = 256):
        if since < 0 or not 0 <= limit <= MAX_STEPS:
            raise APIError(f"since must be >= 0 and limit in [0, {MAX_STEPS}]", param="limit")
        return JSONResponse(await call("steps", since=since, limit=limit))

    @router.get("/v1/engine/requests")
    async def requests(request: Request, limit: int = 200):
        if limit < 0:
            raise APIError("limit must be >= 0", param="limit")
        table = await call("requests", limit=limit)
        if not getattr(request.state, "admin", False):  # (guards.py decides)
            for row in table["requests"]:
                row.pop("id", None)
        return JSONResponse(table)

    @router.post("/start_profile")
    async def start_profile(request: Request):
        # optional body: {"record_shapes": true} (operators' input shapes; slower to stop)
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            raise APIError("the body must be a JSON object", param="record_shapes") from None
        if not isinstance(body, dict):
            raise APIError("the body must be a JSON object", param="record_shapes")
        return JSONResponse(
            await call("start_profile", record_shapes=body.get("record_shapes", False))
        )

    @router.post("/stop_profile")
    async def stop_profile():
        return JSONResponse(await call("stop_profile", PROFILE_STOP_TIMEOUT_S))

    app.include_router(router)


def engine_stats(state: dict) -> dict:
    """One reading of the engine's counters (see the module docstring)."""
    client: AsyncEngineClient = state["client"]
    ready = state["ready"]
    s = client.stats
    m = state["metrics"].samples()
    num_blocks = ready.num_blocks
    used = round(s.kv_usage * num_blocks)
    finished = {
        key.split('"')[1]: int(v)
        for key, v in m.items()
        if key.startswith("cadence:request_success_total{")
    }
    queries, hits = s.prefix_queries, s.prefix_hits
    out = {
        "object": "engine.stats",
        "time": time.time(),
        "uptime_s": round(time.time() - state["started"], 3),
        "model": state["name"],
        "healthy": client.healthy,
        "draining": state["draining"],
        "num_steps": s.num_steps,
        "requests": {
            "running": s.num_running,
            "waiting": s.num_waiting,
            "preempted": s.num_preempted,
            "in_flight": state["admission"].seqs_in_flight,  # sequences the API holds
            "finished": sum(finished.values()),
            "finished_by_reason": finished,
            "rejected": int(m.get("cadence:requests_rejected_total", 0)),
        },
        "kv_cache": {
            "num_blocks": num_blocks,
            "block_size": ready.block_size,
            "used_blocks": used,
            "cached_blocks": s.kv_blocks_cached,
            "free_blocks": num_blocks - used - s.kv_blocks_cached,
            "usage": s.kv_usage,
        },
        "prefix_cache": {
            "queried_tokens": queries,
            "hit_tokens": hits,
            "hit_rate": hits / queries if queries else 0.0,
            "queried_requests": s.prefix_requests,
            "hit_requests": s.prefix_hit_requests,
            "evicted_blocks": s.prefix_evictions,
        },
        "tokens": {
            "prompt": int(m.get("cadence:prompt_tokens_total", 0)),
            "generation": int(m.get("cadence:generation_tokens_total", 0)),
        },
        "preemptions": s.num_preemptions,
        # prompt tokens a step may take beside decodes now (0: no bound), and the decode-only
        # step the pacer prices them against (0: not paced, or not measured yet)
        "scheduler": {"prefill_cap": s.prefill_cap, "decode_step_ms": s.decode_step_ms},
        "images": {  # a vision-language model's (accepted: the chat may attach images)
            "accepted": ready.image_token_id is not None,
            "encoded": s.images_encoded,
            "cache_hits": s.image_cache_hits,
            "tokens": s.image_tokens,
        },
        "kv_transfer": {
            "loads": s.kv_transfer_loads,
            "loaded_tokens": s.kv_transfer_loaded_tokens,
            "failed_loads": s.kv_transfer_failed_loads,
            "load_seconds": round(s.kv_transfer_load_seconds, 6),
            "saved_tokens": s.kv_transfer_saved_tokens,
        },
        "latency": {
            name: {
                "count": int(m.get(f"cadence:{metric}_count", 0)),
                "sum_s": m.get(f"cadence:{metric}_sum", 0.0),
            }
            for name, metric in (
                ("time_to_first_token", "time_to_first_token_seconds"),
                ("inter_token", "inter_token_latency_seconds"),
                ("e2e", "e2e_request_latency_seconds"),
                ("queue", "request_queue_time_seconds"),
            )
        },
        "structured_outputs": {
            "requests": s.structured_requests,
            "grammar_compiles": s.grammar_compiles,
            "grammar_cache_hits": s.grammar_cache_hits,
            "jump_forward_tokens": s.jump_forward_tokens,
        },
        "speculative_decoding": None,
    }
    if state.get("speculative"):
        out["speculative_decoding"] = {
            "verifications": s.spec_verifications,
            "draft_tokens": s.spec_draft_tokens,
            "accepted_tokens": s.spec_accepted_tokens,
            "acceptance_rate": s.spec_accepted_tokens / s.spec_draft_tokens
            if s.spec_draft_tokens
            else 0.0,
            "accepted_per_position": list(s.spec_accepted_per_position),
        }
    return out
