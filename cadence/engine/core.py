"""The engine core: one busy loop over schedule -> execute -> update.

    step():
        sched   = scheduler.schedule()        who runs, how many tokens, which blocks
        sampled = runner.execute(sched)       one forward pass + sampling
        updates = scheduler.update(sched, sampled)   append tokens, stop, free

The offline `LLM` drives this class in-process; the server runs it in its own process
behind a ZMQ socket. Requests arrive as token ids; text never reaches the core.
"""

from __future__ import annotations

import logging
import time

from cadence.config import EngineConfig
from cadence.core.kv_cache import KVCacheManager, make_block_hasher
from cadence.core.request import Request, RequestStatus
from cadence.core.scheduler import RequestUpdate, Scheduler, SchedulerStats
from cadence.sampling_params import SamplingParams
from cadence.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        t0 = time.perf_counter()
        config.validate()
        self.config = config
        self.runner = ModelRunner(config)
        cache = config.cache
        pool_tokens = self.runner.num_blocks * cache.block_size
        self.max_model_len = self.runner.max_model_len
        if pool_tokens < self.max_model_len:
            # A request the pool cannot hold alone would preempt itself forever.
            logger.warning(
                "max_model_len lowered from %d to %d tokens to fit the KV pool",
                self.max_model_len,
                pool_tokens,
            )
            self.max_model_len = pool_tokens
        config.scheduler.max_model_len = self.max_model_len
        self.kv = KVCacheManager(
            self.runner.num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            cache.prefix_cache,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        hashed = cache.enable_prefix_caching and cache.prefix_cache == "hash"
        self._hasher = make_block_hasher(cache.block_size) if hashed else None
        self.eos_token_ids = self.runner.eos_token_ids
        self.vocab_size = self.runner.vocab_size
        cache_kind = cache.prefix_cache if cache.enable_prefix_caching else "off"
        logger.info(
            "engine ready in %.1f s (max_model_len %d, prefix cache %s, scheduling policy %s)",
            time.perf_counter() - t0,
            self.max_model_len,
            cache_kind,
            config.scheduler.scheduling_policy,
        )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Request:
        """Validate and queue one sequence. Raises ValueError naming the problem."""
        params.verify(self.vocab_size)
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"the prompt has {n} tokens; this model's context holds {self.max_model_len} "
                "(prompt + at least one new token)"
            )
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )
        if params.max_tokens is None:
            params.max_tokens = self.max_model_len - n
        req = Request(
            request_id,
            prompt_token_ids,
            params,
            self.eos_token_ids,
            arrival_time,
            priority,
            self._hasher,
        )
        self.scheduler.add_request(req)
        return req

    def abort(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def finish(self, request_ids: list[str]) -> None:
        """End requests as stopped (the output processor saw a stop string)."""
        self.scheduler.abort_requests(request_ids, RequestStatus.FINISHED_STOPPED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestUpdate]:
        sched = self.scheduler.schedule()
        if sched.is_empty and not sched.finished_ids:
            return []
        sampled = self.runner.execute(sched)
        updates = self.scheduler.update(sched, sampled)
        if self.config.check_kv_integrity:
            self.kv.check_integrity()
        return updates

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()
