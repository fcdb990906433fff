"""The engine core: one busy loop over schedule -> execute -> update.

    step():
        sched   = scheduler.schedule()        who runs, how many tokens, which blocks
        out     = runner.execute_model(sched) the forward pass (queued, on a GPU)
        masks   = gate.fill_bitmask(...)      structured outputs, on the CPU meanwhile
        sampled = runner.sample(out, masks)
        verdicts = gate.advance(...)          accept tokens; forced tokens (jump-forward)
        updates = scheduler.update(sched, sampled, verdicts)   append, stop, free

The core keeps the loop; its parts come in at construction, each behind its seam: the
executor (the model's ranks), the KV manager (blocks and the prefix cache), the scheduler
(with disaggregated serving's side of it, a null object when the engine serves alone), the
grammar gate (structured outputs: requests wait there while their grammar compiles, so a
slow schema delays only its own request) and the K/V connector (a null object without
--kv-role).

The offline `LLM` drives this class in-process; the server runs it in its own process
behind a ZMQ socket. Requests arrive as token ids; text never reaches the core.
"""

from __future__ import annotations

import logging
import time

from cadence.config import EngineConfig
from cadence.core.kv_cache import KVCacheManager
from cadence.core.remote_prefill import RemotePrefills
from cadence.core.request import Request, RequestStatus
from cadence.core.scheduler import Scheduler
from cadence.core.scheduler_output import RequestUpdate, SchedulerStats
from cadence.core.step_pacer import prefill_cap
from cadence.engine import step_timeline as tl
from cadence.engine.request_checks import RequestChecks
from cadence.executor import make_executor
from cadence.kv_transfer import make_connector
from cadence.kv_transfer.params import prefill_addrs
from cadence.lora_request import LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.platform import device_type
from cadence.sampling_params import SamplingParams
from cadence.structured.gate import GrammarGate
from cadence.structured.manager import GrammarManager

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        t0 = time.perf_counter()
        config.validate()
        config.fill_defaults(device_type(config.device))
        self.config = config
        # The model's ranks behind one interface (one rank in this process, or tensor
        # parallel ranks elsewhere too); `runner` is the name the loop reads it by.
        self.runner = make_executor(config)
        cache = config.cache
        self.pooling = self.runner.pooling
        if self.pooling is not None and (config.speculative is not None or config.kv_role):
            raise ValueError(
                "an embedding model (--runner pooling) takes no speculative decoding and no "
                "disaggregated prefill (--kv-role)"
            )
        if self.pooling is not None and self.pooling.pooling_type != "LAST":
            # MEAN / CLS read every prompt position's state: a cached one has none.
            cache.enable_prefix_caching = False
        self.kv = KVCacheManager(
            self.runner.num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            cache.prefix_cache,
            cache.radix_eviction_policy,
            # Disaggregation moves whole prompts' blocks: they must all stay held.
            windows=(None,) if config.kv_role else self.runner.kv_group_windows,
        )
        self.max_model_len = self.runner.max_model_len
        # (Speculation: a request also holds k lookahead slots past its tokens.)
        longest = self.kv.longest_alone(
            config.scheduler.max_num_batched_tokens, config.num_lookahead_tokens
        )
        if longest is not None and longest < self.max_model_len:
            # A request the pool cannot hold alone would preempt itself forever.
            logger.warning(
                "max_model_len lowered from %d to %d tokens to fit the KV pool",
                self.max_model_len,
                longest,
            )
            self.max_model_len = longest
        config.scheduler.max_model_len = self.max_model_len
        # Disaggregated serving: moves prompt K/V between engines (a null object without
        # --kv-role); the scheduler's side of it is built with the scheduler.
        self.kv_connector = make_connector(config, self.runner.kv_caches)
        remote = RemotePrefills(self.kv_connector, self.kv) if self.kv_connector.role else None
        lora_slots = config.lora.max_loras if config.lora.enable_lora else 0
        self.scheduler = Scheduler(
            config.scheduler, self.kv, config.num_lookahead_tokens, remote, lora_slots
        )
        self._hasher = self.kv.block_hasher
        self.eos_token_ids = self.runner.eos_token_ids
        self.vocab_size = self.runner.vocab_size
        # An image attended both ways is prefilled in one step: it must fit one's budget.
        self.whole_images = self.runner.whole_images
        self.checks = RequestChecks(
            self.max_model_len,
            self.vocab_size,
            prefill_addrs(config.kv_prefill_addrs),
            self.runner.image_token_id,
            config.scheduler.max_num_batched_tokens if self.whole_images else None,
        )
        sc = config.structured
        self.grammars = GrammarManager(
            None
            if config.model.skip_tokenizer_init
            else (config.model.tokenizer or self.runner.model_path),
            self.vocab_size,
            self.eos_token_ids,
            sc.grammar_cache_size,
            sc.grammar_compile_threads,
            sc.grammar_compile_timeout,
        )
        self.gate = GrammarGate(self.grammars, sc)
        # Async scheduling: the last step's (schedule, launched sampling), read next step.
        self._in_flight = None
        # Schedules the step under way touched (its own, and the one it read back): if it
        # raises, their requests are the failed step's (fail_step).
        self._touched: list = []
        self._stale_in_runner: list[str] = []  # rows the runner drops next step (fail_step)
        self.timeline = tl.StepTimeline(config.step_timeline_size)
        cache_kind = self.kv.cache.kind
        window = self.kv.describe_windows()
        window = f", {window}" if window else ""
        if config.speculative is not None:
            logger.info("speculative decoding: %s", config.speculative.describe())
        sc = config.scheduler
        bound = sc.max_prefill_tokens_while_decoding
        bound = f", <= {bound} prompt tokens beside decodes" if bound else ""
        logger.info(
            "engine ready in %.1f s (max_model_len %d, prefix cache %s, scheduling policy %s, "
            "%d tokens a step%s%s)",
            time.perf_counter() - t0,
            self.max_model_len,
            cache_kind,
            sc.scheduling_policy,
            sc.max_num_batched_tokens,
            bound,
            window,
        )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        lora: LoRARequest | None = None,
        images: list[ImageInput] | None = None,
    ) -> Request:
        """Validate and queue one sequence (of the base model, or of adapter `lora`; with
        `images` behind its image placeholder tokens). Raises ValueError naming the problem."""
        self.checks.check(prompt_token_ids, params, images)
        if lora is not None:
            self.runner.check_lora(lora)
        if images:
            self.runner.check_images(images)
        req = Request(
            request_id,
            prompt_token_ids,
            params,
            self.eos_token_ids,
            arrival_time,
            priority,
            self._hasher,
            lora,
            images,
            self.whole_images,
        )
        if params.structured_outputs is not None:
            if request_id in self.scheduler.requests or request_id in self.gate.awaiting:
                raise ValueError(f"request id {request_id!r} is already in use")
            self.gate.hold(req)
        else:
            self.scheduler.add_request(req)
        return req

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.gate.drop(rid)
        self.scheduler.abort_requests(request_ids)

    def finish(self, request_ids: list[str]) -> None:
        """End requests as stopped (the output processor saw a stop string)."""
        for req in self.scheduler.abort_requests(request_ids, RequestStatus.FINISHED_STOPPED):
            self.gate.drop(req.request_id)

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished_requests()
            or bool(self.gate.awaiting)
            or self._in_flight is not None
        )

    def flush(self) -> None:
        """Read back a step still in flight (async scheduling), so nothing is pending."""
        while self._in_flight is not None:
            self.step()

    def take_failed(self) -> list[tuple[str, str]]:
        """(request id, error) of requests dropped since the last call: their grammar did
        not compile. They produce no RequestUpdate."""
        return self.gate.take_failed()

    def step(self) -> list[RequestUpdate]:
        """One step. If it raises, call fail_step() before the next one."""
        updates = self._step()
        self._touched.clear()
        return updates

    def fail_step(self) -> list[str]:
        """After step() raised: end the failed step's requests and bring the core back to a
        state the next step can trust. Returns the ids ended; they get no RequestUpdate (the
        caller reports an error for each, whether or not the broken step had finished it).

        The failed step's requests are those in the running batch (they hold KV blocks the
        broken step may have half-written, and rows in the runner it may have half-updated),
        those of every schedule the step touched (its own, and with async scheduling the
        one in flight it read back: a request that step finished never heard so), plus any
        whose sampled token was still in flight. Requests that hold no KV (queued, preempted,
        awaiting their grammar) stay queued and run later from a clean slate: the prefix
        cache is forgotten (a block hashed for the broken step may hold garbage), and the
        runner drops the rows of every request the scheduler no longer knows.

        Raises RuntimeError if the KV accounting is still inconsistent afterwards, or if
        the model runs on several ranks (their collectives may be out of step): the engine
        cannot be trusted and should exit.
        """
        if not self.runner.recoverable:
            raise RuntimeError("a tensor-parallel step failed: the ranks may be out of step")
        victims: set[str] = set()
        if self._in_flight is not None:
            self._touched.append(self._in_flight[0])
        for sched in self._touched:
            victims.update(sched.requests)
        self._touched.clear()
        self._in_flight = None
        victims.update(r.request_id for r in self.scheduler.running)
        victims.update(r.request_id for r in self.scheduler.waiting if r.num_placeholders)
        victims.update(rid for rid, blocks in self.kv.req_blocks.items() if blocks)
        self.abort(sorted(victims))  # (also drops the grammars of those it finished)
        known = self.scheduler.requests
        self._stale_in_runner = [rid for rid in self.runner.request_ids() if rid not in known]
        if not self.kv.reset_prefix_cache():
            raise RuntimeError("KV blocks are still held after ending the failed step's requests")
        if self.scheduler.loras is not None:
            self.scheduler.loras.forget()  # (the step may have half-written a slot)
        if self.scheduler.pacer:
            self.scheduler.pacer.forget_launches()  # (none of them will be read back)
        logger.warning(
            "step failed: ended %d request(s); %d still queued", len(victims), len(known)
        )
        return sorted(victims)

    def _step(self) -> list[RequestUpdate]:
        timeline = self.timeline
        timeline.begin()
        if self.config.scheduler.async_scheduling:
            # Jump-forward needs each step's tokens before the next is scheduled: while
            # constrained requests want it, steps run synchronously (after reading back
            # the step in flight).
            if not self.gate.wants_jump_forward(self.scheduler.requests):
                return self._step_async()
            if self._in_flight is not None:
                return self._drain(jump=True)  # nothing launched after it: may jump
        sched = self._schedule()
        if sched.is_empty and not sched.finished_ids:
            return []
        timeline.lap(tl.SCHEDULE)
        model_out = self.runner.execute_model(sched)
        timeline.lap(tl.PREPARE, model_out.forward_start)
        timeline.lap(tl.FORWARD)
        # Filled while the device runs the forward pass (CUDA kernels are queued).
        bitmask = verdicts = None
        if self.gate.active:
            bitmask = self.gate.fill_bitmask(model_out.sample_ids, model_out.drafts)
        sampled = self.runner.sample(model_out, bitmask)
        timeline.lap(tl.SAMPLE)
        self._time_step(sched, model_out.forward_start)
        if bitmask is not None:
            verdicts = self.gate.advance(sampled, self.scheduler.requests)
        updates = self.scheduler.update(sched, sampled, verdicts)
        timeline.lap(tl.OUTPUT)
        timeline.commit(sched, self.runner.image_step)
        if self.config.check_kv_integrity:
            self.kv.check_integrity()
        return updates

    def _step_async(self) -> list[RequestUpdate]:
        """Schedule and launch step N+1 before reading step N's tokens back:

            sched   = schedule()                   N+1; N's tokens count as placeholders
            out     = execute_model(sched)         queued; placeholder ids come from the
                                                   device copy of N's sampled tokens
            sampled = resolve(N)                   the one wait, while N+1 computes
            updates = update(N)                    append, stop, free
            masks   = fill_bitmask(N+1 rows)       grammars have seen N's tokens
            sample_async(out, masks)               N+1's tokens, read back next call

        Returns step N's updates. No jump-forward here: forced tokens would have to come
        before the token N+1 is already computing (step() runs synchronous steps while a
        constrained request wants it)."""
        timeline = self.timeline
        sched = self._schedule()
        timeline.lap(tl.SCHEDULE)
        model_out = self.runner.execute_model(sched)
        timeline.lap(tl.PREPARE, model_out.forward_start)
        timeline.lap(tl.FORWARD)
        updates = self._drain() if self._in_flight is not None else []
        if model_out.sample_ids:
            bitmask = None
            if self.gate.active:
                bitmask = self.gate.fill_bitmask(model_out.sample_ids)
            self._in_flight = (sched, self.runner.sample_async(model_out, bitmask))
            if self.scheduler.pacer:
                self.scheduler.pacer.launched(model_out.forward_start)
            timeline.lap(tl.SAMPLE)
        timeline.commit(sched, self.runner.image_step)
        if self.config.check_kv_integrity:
            self.kv.check_integrity()
        return updates

    def _drain(self, jump: bool = False) -> list[RequestUpdate]:
        """Read back the step in flight and update; launch nothing. `jump`: forced tokens
        may follow, as no later step is in flight yet."""
        prev_sched, pending = self._in_flight
        self._in_flight = None
        self._touched.append(prev_sched)
        sampled = self.runner.resolve(pending)
        self.timeline.lap(tl.SAMPLE)
        self._time_step(prev_sched)
        verdicts = None
        if self.gate.active:
            verdicts = self.gate.advance(sampled, self.scheduler.requests, jump)
        updates = self.scheduler.update(prev_sched, sampled, verdicts)
        self.timeline.lap(tl.OUTPUT)
        return updates

    def _time_step(self, sched, launched: float | None = None) -> None:
        """Tell the pacer (if on) a step's tokens are back: `launched` where the step
        is timed from here (synchronous steps), else from its launched() call."""
        if self.scheduler.pacer:
            now = time.perf_counter()
            if launched is not None:
                self.scheduler.pacer.launched(launched)
            prompt_tokens = sched.total_num_scheduled_tokens - sched.num_decode_tokens
            self.scheduler.pacer.resolved(prompt_tokens, sched.num_decode_seqs, now)

    def _schedule(self):
        """Admit requests whose grammar compiled, schedule, drop finished matchers."""
        self.gate.admit(self.scheduler)
        sched = self.scheduler.schedule()
        if sched.is_empty and self._in_flight is None and self.scheduler.remote.loading:
            time.sleep(0.0005)  # only K/V loads pending: let the loader run, do not spin
        if self._stale_in_runner:  # left behind by a failed step (fail_step)
            sched.finished_ids.extend(self._stale_in_runner)
            self._stale_in_runner = []
        for rid in sched.finished_ids:
            self.gate.drop(rid)
        self._touched.append(sched)
        return sched

    def shutdown(self) -> None:
        """Stop the model's other ranks (tensor parallelism) and the K/V connector."""
        self.kv_connector.close()
        self.runner.shutdown()

    def stats(self) -> SchedulerStats:
        stats = self.scheduler.stats()
        stats.num_waiting += len(self.gate.awaiting)  # waiting for their grammar
        pacer = self.scheduler.pacer
        stats.prefill_cap = prefill_cap(
            self.config.scheduler.max_prefill_tokens_while_decoding, pacer
        )
        if pacer and pacer.decode_s and pacer.decode_s > 0:
            stats.decode_step_ms = round(pacer.decode_s * 1e3, 3)
        return stats
