"""Carrying one answer from a replica back to its client, and ending it when either side
goes away.

    await until_stopped(work, request, replica)   the upstream call, unless the client
                                                  hangs up (ClientGone) or the router gives
                                                  up on the replica (ReplicaGone) first
    relay(resp, replica, metrics, path)           an SSE stream's bytes as they come; ends
                                                  with the API's error event if the replica
                                                  breaks

Cancelling the upstream call closes its connection, which the replica takes for a hang-up
and aborts the request: a client that leaves frees its sequences on the replica, streamed
or not.
"""

from __future__ import annotations

import asyncio

import aiohttp
from fastapi import Request

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.streaming import error_events


class ClientGone(Exception):
    pass


class ReplicaGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body was read: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_stopped(work, request: Request, replica):
    """`work`'s result, or ClientGone / ReplicaGone when that happens first (then `work`
    is cancelled)."""
    task = asyncio.ensure_future(work)
    client = asyncio.ensure_future(_disconnected(request))
    gone = asyncio.ensure_future(replica.gone.wait())
    try:
        await asyncio.wait({task, client, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        client.cancel()
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ReplicaGone if replica.gone.is_set() else ClientGone
    return task.result()


def sse_error(message: str, path: str) -> bytes:
    """The event(s) that end a client's broken stream, in the shape of the API at `path`."""
    return error_events(path)(APIError(message, 502, "service_unavailable")).encode()


async def relay(resp: aiohttp.ClientResponse, replica, metrics, path: str):
    """The replica's SSE bytes as they come; a break mid-stream (or the router giving up
    on the replica) ends the client's stream with an error event (the request is not
    retried: tokens may have gone out). A client that leaves stops the iteration, and the
    `finally` closes the upstream connection."""
    watch = asyncio.ensure_future(_close_when_gone(resp, replica))
    whole = False
    try:
        async for chunk in resp.content.iter_any():  # the bytes as they came, unparsed
            yield chunk
        whole = True
    except (aiohttp.ClientError, TimeoutError) as e:
        if replica.gone.is_set():
            why = "stopped answering"
        else:
            metrics.errors.labels(replica.url, "broken").inc()
            replica.mark_down(f"{type(e).__name__}: {e}")
            why = f"failed mid-stream ({type(e).__name__})"
        yield sse_error(f"replica {replica.url} {why}; the answer is incomplete", path)
    finally:
        watch.cancel()
        replica.in_flight -= 1
        # A whole answer leaves the connection to the pool; one cut short closes it, which
        # the replica takes for a hang-up.
        resp.release() if whole else resp.close()


async def _close_when_gone(resp: aiohttp.ClientResponse, replica) -> None:
    await replica.gone.wait()
    resp.close()  # the relay's read then fails: it ends the stream
