"""The scheduler's side of disaggregated serving (cadence/kv_transfer/connector.py).

Decode engine: a waiting request whose prompt another engine computed
(`kv_transfer_params.do_remote_prefill`) takes its local prefix-cache hits, then blocks for
the rest of its prompt but the last token, and leaves the waiting queue while the connector
loads that K/V in the background. When the load ends it goes back to the front of the
queue with those tokens computed (and their blocks entered in the prefix cache only then,
so no other request reads K/V that has not arrived); the next step computes its last prompt
token and samples. A failed load frees the blocks and the request computes its prompt here.
An aborted request keeps its blocks until its load ends (the loader may be writing them).
Requests that want the same transfer while it loads (the n samples of one prompt) follow
it: they leave the queue with it and come back when its load ends, to find its blocks in
the prefix cache (a transfer is served once); one that comes after the load ended (the
last of the transfers remembered) takes the blocks from the prefix cache and computes the
rest of its prompt.

Prefill engine: a finished request that wants a remote decode has its prompt's K/V staged
by the connector before its blocks are freed.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from cadence.core.scheduler_output import KVTransferStats
from cadence.kv_transfer.params import wants_remote_decode, wants_remote_prefill

if TYPE_CHECKING:
    from cadence.core.kv_cache import KVCacheManager, PrefixHit
    from cadence.core.request import Request

logger = logging.getLogger(__name__)

MAX_DONE_TRANSFERS = 4096  # transfers remembered as loaded (their late siblings load nothing)


def _transfer(req: Request) -> tuple[str, str]:
    """(remote address, transfer id): which prefill engine's staged K/V a request wants."""
    params = req.sampling_params.kv_transfer_params
    return params["remote_addr"], params["transfer_id"]


class NoRemotePrefills:
    """An engine without --kv-role: nothing is loaded, staged or held (a null object, so
    the scheduler never asks whether it serves disaggregated)."""

    loading: dict = {}
    transfers: dict = {}
    num_held = 0
    stats = None

    def wants_load(self, req: Request) -> bool:
        return False

    def try_start(self, req: Request, hits: PrefixHit, num_hit_tokens: int) -> bool | None:
        return False

    def collect(self) -> list[Request]:
        return []

    def holds(self, request_id: str) -> bool:
        return False

    def cancel(self, req: Request) -> bool:
        return False

    def on_finish(self, req: Request) -> None:
        return None


class RemotePrefills:
    def __init__(self, connector, kv: KVCacheManager) -> None:
        self.connector = connector
        self.kv = kv
        # request id -> (request, end of the loaded tokens, time.monotonic() at start)
        self.loading: dict[str, tuple[Request, int, float]] = {}
        self.cancelled: set[str] = set()
        # (remote address, transfer id) -> requests waiting on that load (its first: loading)
        self.transfers: dict[tuple[str, str], list[Request]] = {}
        self.done: OrderedDict[tuple[str, str], None] = OrderedDict()  # loads that ended
        self.stats = KVTransferStats()

    # ---- decode side ------------------------------------------------------------------

    def wants_load(self, req: Request) -> bool:
        return (
            not req.remote_prefill_done
            and req.num_computed_tokens == 0
            and wants_remote_prefill(req.sampling_params.kv_transfer_params)
        )

    def try_start(self, req: Request, hits: PrefixHit, num_hit_tokens: int) -> bool | None:
        """Start loading the prompt past the local hits. True: started (the request leaves
        the waiting queue); False: nothing to load; None: no room in the pool now."""
        end = req.num_prompt_tokens - 1
        num_remote = end - num_hit_tokens
        if num_remote <= 0:
            req.remote_prefill_done = True
            return False
        key = _transfer(req)
        if key in self.done:  # served already (to a sibling): what is cached is all there is
            req.remote_prefill_done = True
            return False
        if key in self.transfers:  # being loaded for another request: follow it
            req.remote_prefill_done = True
            self.transfers[key].append(req)
            return True
        if self.kv.allocate_slots(req, num_remote, hits, cache=False) is None:
            return None
        req.remote_prefill_done = True
        req.num_computed_tokens = num_hit_tokens
        self.loading[req.request_id] = (req, end, time.monotonic())
        self.transfers[key] = [req]
        self.connector.start_load(
            req.request_id,
            req.sampling_params.kv_transfer_params,
            self.kv.get_block_ids(req.request_id),
            num_hit_tokens,
            end,
        )
        return True

    def collect(self) -> list[Request]:
        """Requests whose load ended, ready to schedule again (front of the queue)."""
        ready = []
        for rid, err in self.connector.finished_loads():
            req, end, started = self.loading.pop(rid)
            key = _transfer(req)
            followers = self.transfers.pop(key)[1:]
            self.done[key] = None
            if len(self.done) > MAX_DONE_TRANSFERS:
                self.done.popitem(last=False)
            if rid in self.cancelled:
                self.cancelled.discard(rid)
                self.kv.free(req)
                ready.extend(followers)
                continue
            if err is None:
                self.stats.num_loads += 1
                self.stats.num_loaded_tokens += end - req.num_computed_tokens
                self.stats.load_seconds += time.monotonic() - started
                req.num_computed_tokens = end
                self.kv.cache_blocks(req, end)
            else:
                self.stats.num_failed_loads += 1
                logger.warning("request %s: K/V load failed (%s); computing its prompt", rid, err)
                self.kv.free(req)
                req.num_computed_tokens = 0
            ready.append(req)
            ready.extend(followers)  # (they find its blocks in the prefix cache)
        return ready

    @property
    def num_held(self) -> int:
        return sum(len(waiting) for waiting in self.transfers.values())

    def holds(self, request_id: str) -> bool:
        """Out of the queues: loading, or following another request's load."""
        return request_id in self.loading or any(
            r.request_id == request_id for waiting in self.transfers.values() for r in waiting
        )

    def cancel(self, req: Request) -> bool:
        """An abort of a request this holds. True: it was loading, its blocks are freed
        when the load ends; False: it was following (it holds no blocks)."""
        if req.request_id in self.loading:
            self.cancelled.add(req.request_id)
            return True
        for waiting in self.transfers.values():
            if req in waiting[1:]:
                waiting.remove(req)
        return False

    # ---- prefill side -----------------------------------------------------------------

    def on_finish(self, req: Request) -> None:
        """Stage a finished request's prompt K/V (before its blocks are freed). A failure
        here is logged, never raised: the request is done either way, its blocks must be
        freed, and a decode engine that finds nothing staged computes the prompt itself."""
        params = req.sampling_params.kv_transfer_params
        if wants_remote_decode(params):
            num_tokens = min(req.num_computed_tokens, req.num_prompt_tokens)
            block_ids = self.kv.get_block_ids(req.request_id)
            num_blocks = -(-num_tokens // self.kv.block_size)
            try:
                self.connector.save(params["transfer_id"], block_ids[:num_blocks], num_tokens)
            except Exception:
                logger.exception("request %s: staging its K/V failed", req.request_id)
                return
            self.stats.num_saved_tokens += num_tokens
