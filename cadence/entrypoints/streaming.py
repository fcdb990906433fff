"""Delivering results: SSE streams, and non-streamed results that stop when the client leaves.

await sse_response(chunks, on_error)    StreamingResponse of an async iterator of SSE
                                        events; errors before the first event are status
                                        codes, errors after it end the stream with the
                                        API's error event (chat's: the error object and
                                        `data: [DONE]`)
await unless_disconnected(coro, request)  run a non-streamed request; a hang-up cancels
                                        it (the cancellation aborts it in the engine)
StreamCursor, merge, sse                building blocks of the streaming endpoints
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cadence.engine.output_processor import RequestState
from cadence.entrypoints.errors import (
    ANTHROPIC_PATHS,
    APIError,
    anthropic_error_body,
    api_error_for,
)

DONE = "data: [DONE]\n\n"


_encode = msgspec.json.Encoder().encode


def _json(body: dict) -> str:
    """Compact JSON, UTF-8 as is, by msgspec (a tenth of json.dumps's time: an event per
    token per stream). A non-finite float, which JSON cannot spell, is null."""
    return _encode(body).decode()


def sse(body: dict) -> str:
    """One server-sent event."""
    return f"data: {_json(body)}\n\n"


def sse_event(name: str, body: dict) -> str:
    """One server-sent event with an event name (the Responses and Messages APIs)."""
    return f"event: {name}\ndata: {_json(body)}\n\n"


def chat_error_events(err: APIError) -> str:
    return sse(err.body()) + DONE


def _responses_error_event(err: APIError) -> str:
    """The Responses API's `error` event (with the error object too: the SDK raises on it)."""
    body = err.body()["error"]
    event = {"type": "error", "code": str(body["code"]), "message": body["message"]}
    return sse_event("error", {**event, "param": body["param"], "error": body})


def error_events(path: str) -> Callable[[APIError], str]:
    """What ends a stream that failed after its status went out, in the shape of the API
    at `path`: chat's error chunk and [DONE], the Responses API's `error` event, or
    Anthropic's `event: error` (its SDK skips events without a name)."""
    if path.startswith(ANTHROPIC_PATHS):
        return lambda err: sse_event("error", anthropic_error_body(err))
    if path.startswith("/v1/responses"):
        return _responses_error_event
    return chat_error_events


async def sse_response(
    chunks: AsyncIterator[str], on_error: Callable[[APIError], str] = chat_error_events
) -> StreamingResponse:
    # Start the stream before answering, so errors at submission (429, 400) are status codes.
    first = await anext(chunks, None)

    async def body():
        try:
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk
        except Exception as e:  # the 200 is out: the error becomes the stream's last event
            yield on_error(api_error_for(e))
        finally:
            await chunks.aclose()  # a hang-up lands here: aborts the request in the core

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up. The body was read already (the guard replays it),
    so the next message `receive` gives is the disconnect, whenever it comes."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(coro, request: Request) -> Response:
    """Non-streamed: the JSON result, or (the client hung up) cancel the request, 499."""
    task = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()  # the hang-up (or our own cancellation): abort in the engine
            await asyncio.gather(task, return_exceptions=True)
        watch.cancel()
    if task.cancelled():
        return Response(status_code=499)
    return JSONResponse(task.result())


class StreamCursor:
    """What each sample of a streamed request has not been sent yet."""

    def __init__(self, output_processor, n: int) -> None:
        self.output_processor = output_processor
        self.sent_tokens = [0] * n
        self.final_sent = [False] * n

    def deltas(self, state: RequestState):
        """Yield (output, new text, new token ids, their logprobs, finished) per sample
        that has news; each sample's finish is reported once."""
        for s in state.samples:
            out = s.output
            i = out.index
            if self.final_sent[i]:
                continue
            delta = self.output_processor.streamable_text(state, i)
            start = self.sent_tokens[i]
            new_ids = out.token_ids[start:]
            finished = out.finish_reason is not None
            if not delta and not new_ids and not finished:
                continue
            new_lps = (
                out.logprobs[start : start + len(new_ids)] if out.logprobs is not None else None
            )
            self.sent_tokens[i] = len(out.token_ids)
            self.final_sent[i] = finished
            yield out, delta, new_ids, new_lps, finished


async def merge(runs: list[AsyncGenerator]) -> AsyncIterator[tuple[int, object]]:
    """(index of the run, item) from several async iterators at once, as items arrive.
    The first error ends the merge; leaving it early (a hang-up) cancels every run, whose
    own cleanup then aborts its request in the engine."""
    if len(runs) == 1:  # the common case: no pump task, no queue hop per item
        run = runs[0]
        try:
            async for item in run:
                yield 0, item
        finally:
            await run.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, run: AsyncIterator) -> None:
        try:
            async for item in run:
                await queue.put((i, item))
        except Exception as e:
            await queue.put((i, e))
            return
        await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(runs)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
