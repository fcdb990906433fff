"""A data-parallel deployment seen as one server: the replicas' metrics, engine view and web
app through the router (`cadence serve -dp N`, `cadence router`).

    GET /metrics              the router's own series (router_metrics), then each replica's
                              series twice over: per replica, with a `replica` label (its
                              URL), and summed over the replicas that answered, with
                              replica="all" (a fraction, `*_perc`: their mean). Scraped with
                              the router's key when each /metrics is asked for.
    GET /v1/engine/stats      ?replica=I: replica I's; without: the replicas in rotation
                              summed (counters and queues add up; rates and fractions are
                              recomputed from the sums), with their URLs under "replicas"
    GET /v1/engine/steps      ?replica=I (default 0): that replica's step timeline
    GET /v1/engine/requests   ?replica=I (default 0): the requests its engine holds
    GET /, /ui/...            the web app; its engine view offers one tab per replica (it
                              finds them in /v1/router/replicas)

The engine view's calls carry the client's own Authorization to the replica, so what a
replica shows (other users' request ids only to the admin key) is decided there, as when it
is asked directly. `replica` is an index into the router's list, checked (400 otherwise).
"""

from __future__ import annotations

import asyncio
import functools
from itertools import zip_longest

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.web_ui import install_web_ui

SCRAPE_TIMEOUT_S = 5.0
ENGINE_VIEW_PATHS = ("/v1/engine/stats", "/v1/engine/steps", "/v1/engine/requests")


def install_replica_views(app: FastAPI, state: dict, own_metrics) -> None:
    """`state["replicas"]`: the ReplicaSet; `own_metrics()`: the router's exposition text."""
    install_web_ui(app)

    def replica_at(request: Request, default: int | None):
        replicas = state["replicas"].replicas
        raw = request.query_params.get("replica")
        if raw is None and default is None:
            return None
        try:
            index = int(raw) if raw is not None else default
        except ValueError:
            index = -1
        if not 0 <= index < len(replicas):
            raise APIError(f"replica must be an index in [0, {len(replicas)})", param="replica")
        return replicas[index]

    def client_auth(request: Request) -> dict:
        return {k: v for k, v in request.headers.items() if k.lower() == "authorization"}

    async def ask(replica, path: str, request: Request) -> httpx.Response:
        params = {k: v for k, v in request.query_params.items() if k != "replica"}
        try:
            return await state["replicas"].http.get(
                replica.url + path,
                params=params,
                headers=client_auth(request),
                timeout=SCRAPE_TIMEOUT_S,
            )
        except httpx.HTTPError as e:
            raise APIError(
                f"replica {replica.url} did not answer: {type(e).__name__}",
                502,
                "service_unavailable",
            ) from None

    def passed_on(resp: httpx.Response) -> Response:
        return Response(resp.content, resp.status_code, media_type="application/json")

    def answering(route):
        """The route's APIError as the error object (the router has no handlers for them)."""

        @functools.wraps(route)
        async def wrapped(request: Request):
            try:
                return await route(request)
            except APIError as e:
                return e.response()

        return wrapped

    @app.get("/v1/engine/stats")
    @answering
    async def stats(request: Request):
        one = replica_at(request, None)
        if one is not None:
            return passed_on(await ask(one, "/v1/engine/stats", request))
        healthy = state["replicas"].healthy()
        if not healthy:
            raise APIError("no replica is in rotation", 503, "service_unavailable")
        answers = await asyncio.gather(*(ask(r, "/v1/engine/stats", request) for r in healthy))
        for resp in answers:
            if resp.status_code != 200:
                return passed_on(resp)  # (a 401 from the replicas: the client's key)
        merged = summed_stats([resp.json() for resp in answers])
        merged["replicas"] = [r.url for r in healthy]
        return JSONResponse(merged)

    @app.get("/v1/engine/steps")
    @answering
    async def steps(request: Request):
        return passed_on(await ask(replica_at(request, 0), "/v1/engine/steps", request))

    @app.get("/v1/engine/requests")
    @answering
    async def requests(request: Request):
        return passed_on(await ask(replica_at(request, 0), "/v1/engine/requests", request))

    @app.get("/metrics")
    async def metrics():
        replicas = state["replicas"]

        async def scrape(r) -> str | None:
            try:
                resp = await replicas.http.get(
                    r.url + "/metrics", headers=replicas.auth, timeout=SCRAPE_TIMEOUT_S
                )
            except httpx.HTTPError:
                return None
            return resp.text if resp.status_code == 200 else None

        texts = await asyncio.gather(*(scrape(r) for r in replicas.replicas))
        answered = {r.url: t for r, t in zip(replicas.replicas, texts) if t is not None}
        body = own_metrics() + merged_metrics(answered).encode()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


# ---- /v1/engine/stats summed --------------------------------------------------------------


def _summed(values: list):
    """Numbers add up (lists element by element, dicts key by key); flags: all true;
    anything else (names, None): the first replica's."""
    first = values[0]
    if isinstance(first, bool):
        return all(values)
    if isinstance(first, (int, float)):
        return sum(v for v in values if isinstance(v, (int, float)))
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in values if isinstance(v, dict) for k in v)
        return {k: _summed([v[k] for v in values if isinstance(v, dict) and k in v]) for k in keys}
    if isinstance(first, list) and all(isinstance(x, (int, float)) for x in first):
        lists = [v for v in values if isinstance(v, list)]
        return [sum(xs) for xs in zip_longest(*lists, fillvalue=0)]
    return first


def summed_stats(readings: list[dict]) -> dict:
    """Several replicas' /v1/engine/stats as one reading."""
    out = _summed(readings)
    out["time"] = max(r["time"] for r in readings)
    out["uptime_s"] = max(r["uptime_s"] for r in readings)
    out["draining"] = any(r["draining"] for r in readings)
    kv = out["kv_cache"]
    kv["usage"] = kv["used_blocks"] / kv["num_blocks"] if kv["num_blocks"] else 0.0
    pc = out["prefix_cache"]
    pc["hit_rate"] = pc["hit_tokens"] / pc["queried_tokens"] if pc["queried_tokens"] else 0.0
    own = [r["scheduler"] for r in readings if isinstance(r.get("scheduler"), dict)]
    if own:  # (each replica paces its own steps: not a sum)
        caps = [o.get("prefill_cap", 0) for o in own]
        out["scheduler"] = {
            "prefill_cap": 0 if 0 in caps else max(caps),  # (0: a replica has no bound)
            "decode_step_ms": max(o.get("decode_step_ms", 0.0) for o in own),
        }
    spec = out.get("speculative_decoding")
    if isinstance(spec, dict):
        drafts = spec.get("draft_tokens") or 0
        spec["acceptance_rate"] = spec.get("accepted_tokens", 0) / drafts if drafts else 0.0
    return out


# ---- /metrics merged ------------------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def merged_metrics(texts: dict[str, str]) -> str:
    """The replicas' exposition texts (URL -> text) as one: each sample per replica (label
    `replica`) and summed over them (replica="all"; `*_perc` gauges averaged)."""
    families: dict[str, dict] = {}  # name -> {type, help, samples: {key: [values]}, per: [...]}
    for url, text in texts.items():
        for fam in text_string_to_metric_families(text):
            f = families.setdefault(
                fam.name, {"type": fam.type, "help": fam.documentation, "per": [], "sums": {}}
            )
            for s in fam.samples:
                if s.name.endswith("_created"):  # (a creation time: not summable)
                    continue
                f["per"].append((s.name, {**s.labels, "replica": url}, s.value))
                key = (s.name, tuple(sorted(s.labels.items())))
                f["sums"].setdefault(key, []).append(s.value)
    lines = []
    for name, f in families.items():
        shown = f"{name}_total" if f["type"] == "counter" else name
        lines.append(f"# HELP {shown} {f['help']}")
        lines.append(f"# TYPE {shown} {f['type']}")
        for sample, labels, value in f["per"]:
            lines.append(f"{sample}{_labels(labels)} {floatToGoString(value)}")
        for (sample, labels), values in f["sums"].items():
            total = sum(values) / len(values) if sample.endswith("_perc") else sum(values)
            lines.append(f"{sample}{_labels({**dict(labels), 'replica': 'all'})} "
                         f"{floatToGoString(total)}")  # fmt: skip
    return "\n".join(lines) + ("\n" if lines else "")
