"""How `cadence bench serve` talks to the server: the client, the model to send, the
request bodies, and one streamed request timed on this side (see cadence/bench/serve.py).

The streamed requests go through aiohttp (its C HTTP parser), the rest through httpx: at
tens of thousands of streamed tokens a second httpx's per-read machinery made the client
itself the bottleneck (about 100 µs a token: two cores at an H200's rate), and its late
reads showed up as the server's inter-token latency."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from cadence.bench.datasets import BenchPrompt
from cadence.bench.serve_args import BenchError
from cadence.bench.stats import RequestRecord

if TYPE_CHECKING:
    import aiohttp


@dataclass
class ServerInfo:
    base_url: str
    model: str
    model_root: str | None  # /v1/models' "root" (Cadence: the model folder)
    version: dict[str, Any] | None


def base_url(args: argparse.Namespace) -> str:
    url = args.base_url or f"http://{args.host}:{args.port}"
    return url.rstrip("/").removesuffix("/v1")


def make_client(args: argparse.Namespace) -> BenchClient:
    key = args.api_key or os.environ.get("OPENAI_API_KEY") or os.environ.get("CADENCE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return BenchClient(
        base_url=base_url(args),
        headers=headers,
        timeout=httpx.Timeout(args.request_timeout, connect=min(30.0, args.request_timeout)),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


class BenchClient(httpx.AsyncClient):
    """httpx's client for the questions (models, metrics, errors), with an aiohttp session
    beside it, opened with it, for the timed streams (`streams`, same address and headers)."""

    streams: aiohttp.ClientSession | None = None

    async def __aenter__(self):
        import aiohttp

        await super().__aenter__()
        t = self.timeout
        self.streams = aiohttp.ClientSession(
            headers={k: v for k, v in self.headers.items() if k.lower() == "authorization"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=t.connect, sock_read=t.read),
            connector=aiohttp.TCPConnector(limit=0),
        )
        return self

    async def __aexit__(self, *exc) -> None:
        if self.streams is not None:
            await self.streams.close()
        await super().__aexit__(*exc)


def error_message(raw: bytes) -> str:
    """The message of an OpenAI error body, or the body's start."""
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw[:200].decode(errors="replace")


async def _get_models(client: httpx.AsyncClient, timeout_s: int) -> httpx.Response:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await client.get("/v1/models")
        except httpx.TransportError as e:
            if time.monotonic() >= deadline:
                raise BenchError(f"cannot reach the server at {client.base_url}: {e}") from None
            await asyncio.sleep(1.0)


async def server_info(client: httpx.AsyncClient, args: argparse.Namespace) -> ServerInfo:
    """The model to send (--model or the first of /v1/models) and the server's /version."""
    resp = await _get_models(client, args.ready_check_timeout_sec)
    model, root = args.model, None
    if resp.status_code == 200:
        data = resp.json().get("data") or []
        ids = [m.get("id") for m in data]
        if model is None:
            if not ids:
                raise BenchError("/v1/models lists no model; give --model")
            model = ids[0]
        elif model not in ids:
            print(f"warning: --model {model!r} is not in /v1/models ({ids})", file=sys.stderr)
        root = next((m.get("root") for m in data if m.get("id") == model), None)
    elif resp.status_code == 401:
        raise BenchError(
            f"the server refused the API key (401: {error_message(resp.content)}); give --api-key"
        )
    elif model is None:
        raise BenchError(
            f"/v1/models answered {resp.status_code} ({error_message(resp.content)}); give --model"
        )
    version = None
    with contextlib.suppress(Exception):
        v = await client.get("/version")
        if v.status_code == 200:
            version = v.json()
    return ServerInfo(str(client.base_url).rstrip("/"), model, root, version)


def request_body(p: BenchPrompt, model: str, chat: bool, args: argparse.Namespace) -> dict:
    """The streaming request of one prompt."""
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": args.temperature,
    }
    if chat:
        body["messages"] = p.as_chat()
        if p.max_tokens is not None:
            body["max_completion_tokens"] = p.max_tokens
    else:
        body["prompt"] = p.prompt
        if p.max_tokens is not None:
            body["max_tokens"] = p.max_tokens
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if args.top_k is not None:
        body["top_k"] = args.top_k
    if args.extra_body:
        body.update(args.extra_body)
    return body


def chunk_text(chunk: dict[str, Any], chat: bool) -> str:
    """The text a chunk carries (chat: delta.content; the role-only first chunk has none)."""
    parts = []
    for choice in chunk.get("choices") or []:
        if chat:
            parts.append((choice.get("delta") or {}).get("content") or "")
        else:
            parts.append(choice.get("text") or "")
    return "".join(parts)


async def sse_chunks(resp) -> AsyncIterator[dict[str, Any] | None]:
    """The JSON chunks of an SSE response, then None for `data: [DONE]` (nothing after
    it). A stream that stops without [DONE] just ends; bad JSON raises JSONDecodeError."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            yield None
            return
        yield json.loads(data)


async def _sse_chunks_of(content) -> AsyncIterator[dict[str, Any] | None]:
    """sse_chunks over an aiohttp body: the bytes as they come, cut into lines here (no
    line-length limit: one event may hold a long list of logprobs)."""
    rest = b""
    async for data in content.iter_any():
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                yield None
                return
            yield json.loads(payload)


async def send_request(
    client: BenchClient, path: str, body: dict, chat: bool, rec: RequestRecord, t0: float
) -> None:
    """Stream one request and fill `rec`'s times (seconds) and the server's usage."""
    import aiohttp

    st = time.perf_counter()
    rec.start = st - t0
    last = st
    pieces: list[str] = []
    done = False
    try:
        url = str(client.base_url).rstrip("/") + "/" + path.lstrip("/")
        async with client.streams.post(url, json=body) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {error_message(await resp.read())}"
                return
            async for chunk in _sse_chunks_of(resp.content):
                if chunk is None:
                    done = True
                    break
                now = time.perf_counter()
                if "error" in chunk:
                    rec.error = f"error in stream: {error_message(json.dumps(chunk).encode())}"
                    break
                if chunk.get("usage"):
                    rec.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    rec.output_tokens = chunk["usage"].get("completion_tokens")
                    rec.usage_source = "server"
                text = chunk_text(chunk, chat)
                if text:
                    if rec.ttft is None:
                        rec.ttft = now - st
                    else:
                        rec.itls.append(now - last)
                    last = now
                    pieces.append(text)
            rec.e2e = time.perf_counter() - st
    except (aiohttp.ClientError, TimeoutError) as e:
        rec.error = f"{type(e).__name__}: {e or 'no detail'}"
    except json.JSONDecodeError as e:
        rec.error = f"bad JSON in the stream: {e.msg}"
    rec.generated_text = "".join(pieces)
    if not rec.error and not done:
        rec.error = "the stream ended without data: [DONE]"
    rec.success = not rec.error


def error_kind(error: str) -> str:
    """The kind of a request's error, for counting: "HTTP 503", an exception's class
    ("ReadTimeout"), or the message's start for errors found in the stream."""
    if error.startswith("HTTP "):
        return error.split(":", 1)[0]
    head = error.split(":", 1)[0]
    if head.isidentifier():
        return head
    return error[:40]
