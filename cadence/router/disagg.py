"""Disaggregated prefill/decode through the router (`cadence router --prefill URL --decode
URL`): each request is computed in two places.

    1. a prefill replica (chosen by the policy among the prefill set, so the cache-aware
       one reuses its prefix cache) gets the prompt with max_tokens 1 and
       kv_transfer_params {"do_remote_decode", "transfer_id"}: it computes the prompt and
       keeps its K/V staged under that id;
    2. a decode replica gets the request as the client sent it, plus
       {"do_remote_prefill", "remote_addr", "transfer_id"}: it loads that K/V over the
       connector, computes the prompt's last token, and answers (streamed or not).

If no prefill replica can be reached the decode replica computes the prompt itself; a
prefill replica's 4xx (a bad request) is the client's answer. Both requests' params are
signed with the deployment's secret (kv_transfer/params.py): engines take the field from
nobody else.
"""

from __future__ import annotations

import uuid

import httpx
from fastapi.responses import Response

from cadence.kv_transfer.params import sign
from cadence.router.relay import ReplicaGone
from cadence.router.replicas import ReplicaSet

# What only shapes the output: the prefill replica's one token is thrown away.
PREFILL_DROP = frozenset(
    {
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "n",
        "best_of",
        "logprobs",
        "top_logprobs",
        "echo",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "stop",
        "prompt_logprobs",
        "kv_transfer_params",
    }
)


async def prefill_remotely(
    prefills: ReplicaSet,
    route,
    path: str,
    body: dict,
    headers: dict,
    metrics,
    secret: str,
    until_stopped,
) -> tuple[dict | None, Response | None]:
    """Run step 1 (`route(tried)`: the policy's pick among the healthy prefill replicas
    not yet tried, or None; `until_stopped(work, replica)`: `work`, unless the client or
    the replica goes first: relay.py). Returns (the decode request's kv_transfer_params,
    None), or (None, an error response for the client), or (None, None) when no prefill
    replica is there."""
    transfer_id = uuid.uuid4().hex
    pbody = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    pbody["max_tokens"] = 1
    pbody["kv_transfer_params"] = sign(
        {"do_remote_decode": True, "transfer_id": transfer_id}, secret
    )
    tried: set[int] = set()
    while True:
        replica = route(tried)
        if replica is None:
            return None, None
        tried.add(replica.index)
        addr = (replica.info.get("kv_transfer") or {}).get("addr")
        if not addr:
            replica.mark_down("not a prefill engine (no kv_transfer address in /version)")
            continue
        replica.in_flight += 1
        replica.sent_since_poll += 1
        try:
            work = prefills.http.post(replica.url + path, json=pbody, headers=headers)
            resp = await until_stopped(work, replica)
        except (httpx.HTTPError, ReplicaGone) as e:
            metrics.errors.labels(replica.url, "unreachable").inc()
            replica.mark_down(f"{type(e).__name__}: {e}")
            continue
        finally:
            replica.in_flight -= 1
        if resp.status_code != 200:
            media = resp.headers.get("content-type", "application/json")
            return None, Response(resp.content, resp.status_code, media_type=media)
        params = {"do_remote_prefill": True, "remote_addr": addr, "transfer_id": transfer_id}
        return sign(params, secret), None
