"""The scheduling policy: who runs this step, and how many tokens each.

No phases: each step hands out a token budget (`max_num_batched_tokens`).

  1. Running requests first, in order; each wants num_tokens - num_computed_tokens
     (1 when decoding, a chunk while its prompt is still being prefilled).
  2. Then waiting requests, FCFS, while budget and `max_num_seqs` last; a prompt longer than
     what is left gets a chunk now, the rest later (chunked prefill).
     While some request decodes, prompt tokens (1. and 2. together) are also bounded by
     `max_prefill_tokens_while_decoding` (or step_pacer's lower cap): its next token waits
     for the whole step.
  3. A running request that cannot get a block preempts a victim (lowest priority, then
     latest arrival, among those not yet scheduled this step): its blocks are freed, its
     computed tokens reset to 0, and it goes to the front of the waiting queue (recompute).

`schedule()` returns a SchedulerOutput of deltas for the worker; `update()` takes the tokens
the worker sampled, appends them, checks stop conditions and frees finished requests.

Speculative decoding: a decoding request may carry draft tokens (`spec_token_ids`, guessed
by a proposer after the last step). They are scheduled like any token (budget, KV slots)
and listed in `SchedulerOutput.spec_token_ids`; update() keeps the accepted ones plus the
target's own next token, and rolls `num_computed_tokens` back over the rejected ones (their
K/V is overwritten later). Blocks get prefix-cache hashes from accepted tokens only.

With `async_scheduling`, step N+1 is scheduled before step N's tokens are known: schedule()
advances num_computed_tokens itself and counts a placeholder for each token the step will
sample, so the next schedule() sees that token as one to compute (the worker fills its id
in on the device). update(N) then only appends the ids. A request that turns out to have
finished at N may have computed one token more at N+1; that token is dropped.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

from cadence.config import SchedulerConfig
from cadence.core.kv_cache import KVCacheManager
from cadence.core.lora_slots import LoRASlots
from cadence.core.policies import make_policy
from cadence.core.remote_prefill import NoRemotePrefills, RemotePrefills
from cadence.core.request import FINISH_REASONS, Request, RequestStatus
from cadence.core.scheduler_output import (
    NO_VERDICTS,
    CachedRequestData,
    GrammarVerdicts,
    NewRequestData,
    RequestUpdate,
    SampledTokens,
    SchedulerOutput,
    SchedulerStats,
    SpecDecodeStats,
)
from cadence.core.step_pacer import StepPacer, prefill_cap

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: KVCacheManager,
        num_lookahead_tokens: int = 0,
        remote: RemotePrefills | NoRemotePrefills | None = None,
        num_lora_slots: int = 0,
    ) -> None:
        """`num_lookahead_tokens`: KV slots each request gets past its scheduled tokens
        (speculative decoding: where the proposer writes its guesses' K/V); 0: none and no
        speculation. `remote`: disaggregated serving's side of the scheduler
        (remote_prefill.py); None: an engine that serves alone. `num_lora_slots`: the
        worker's adapter slots (0: no LoRA)."""
        self.config = config
        self.kv = kv_manager
        self.num_lookahead_tokens = num_lookahead_tokens
        self.spec_stats = SpecDecodeStats() if num_lookahead_tokens else None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._finished_ids: list[str] = []  # to tell the worker next step
        self._seen_by_worker: set[str] = set()
        self.policy = make_policy(config.scheduling_policy, config.scheduling_aging_steps)
        self.step_count = 0
        self.remote = remote if remote is not None else NoRemotePrefills()
        self.loras = LoRASlots(num_lora_slots) if num_lora_slots else None
        # (the engine core times the steps it runs into it: step_pacer.py)
        self.pacer = StepPacer(config.mixed_step_factor) if config.mixed_step_factor else None

    # ---- queue management -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        request.enqueue_step = self.step_count
        self.waiting.append(request)

    def abort_requests(
        self, request_ids: Iterable[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> list[Request]:
        """End requests from outside: an abort, or a stop string the output processor saw."""
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            if self.remote.holds(rid):
                if self.remote.cancel(req):  # loading: its blocks go when the load ends
                    req.status = status
                    del self.requests[rid]
                else:  # following another's load: it holds nothing
                    self._finish(req, status)
                aborted.append(req)
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._finish(req, status)
            aborted.append(req)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.remote.transfers)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- one step ---------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        self.step_count += 1
        budget = self.config.max_num_batched_tokens
        prefill_left = self._prefill_budget(budget)  # prompt (or recompute) tokens
        new_blocks: dict[str, list[list[int]]] = {}  # request id -> per KV group
        preempted: list[Request] = []
        if self.remote.loading:
            self.waiting.extendleft(reversed(self.remote.collect()))
        self._order_waiting()
        priority_preempted = self._preempt_for_priority() if self.policy.preemptive else []

        # 1. Running requests, in order.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens + req.num_placeholders - req.num_computed_tokens, budget)
            prefilling = num_new > 1  # a prompt chunk (or a preempted request's recompute)
            if prefilling:  # (a chunk never ends inside an image attended both ways)
                num_new = req.fit_chunk(req.num_computed_tokens, min(num_new, prefill_left), budget)
            if num_new <= 0 or (req.num_placeholders and self._ends_with_placeholder(req)):
                i += 1
                continue
            drafts = self._drafts_to_verify(req, num_new, budget)
            num_new += len(drafts)
            while True:
                blocks = self.kv.allocate_slots(req, num_new, lookahead=self.num_lookahead_tokens)
                if blocks is not None:
                    break
                victim = self._pick_victim(i)
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if blocks is None:  # req itself was preempted; running[i] is now the next one
                continue
            new_blocks[req.request_id] = [[b.block_id for b in group] for group in blocks]
            out.num_scheduled_tokens[req.request_id] = num_new
            if req.num_computed_tokens >= req.num_prompt_tokens:  # decoding (the timeline)
                out.num_decode_seqs += 1
                out.num_decode_tokens += num_new
            if drafts:
                out.spec_token_ids[req.request_id] = drafts
            budget -= num_new
            if prefilling:
                prefill_left -= num_new
            i += 1

        # 2. Waiting requests, FCFS. None if this step had to preempt: memory is short.
        # One whose adapter finds no free slot steps aside for those behind it.
        no_slot: list[Request] = []
        if self.loras is not None:
            self.loras.begin_step(self.running)
        while self.waiting and min(budget, prefill_left) > 0 and not preempted:
            if len(self.running) >= self.config.max_num_seqs:
                break
            req = self.waiting[0]
            if req.num_placeholders:
                break  # preempted while its last token was in flight: wait for that token
            if self.loras is not None and not self.loras.admit(
                req, self.step_count, out.lora_loads
            ):
                no_slot.append(self.waiting.popleft())
                continue
            hits, num_hit_tokens = [], 0
            if req.num_computed_tokens == 0:
                hits, num_hit_tokens = self.kv.get_computed_blocks(req)
                if self.remote.wants_load(req):
                    started = self.remote.try_start(req, hits, num_hit_tokens)
                    if started is None:
                        break  # no room for its blocks: FCFS waits
                    if started:  # loading in the background; back in the queue when done
                        self.waiting.popleft()
                        self._count_lookup(req, num_hit_tokens)
                        continue
            start = req.num_computed_tokens + num_hit_tokens
            num_new = min(req.num_tokens - start, budget, prefill_left)
            num_new = req.fit_chunk(start, num_new, budget)
            blocks = None
            if num_new > 0:
                blocks = self.kv.allocate_slots(req, num_new, hits, self.num_lookahead_tokens)
            if blocks is None:
                break  # FCFS: nobody jumps the queue for lack of memory (or budget)
            prefill_left -= num_new
            self.waiting.popleft()
            if req.num_computed_tokens == 0:  # (else its prompt came from a remote prefill)
                self._count_lookup(req, num_hit_tokens)
            req.num_computed_tokens += num_hit_tokens
            was_preempted = req.status == RequestStatus.PREEMPTED
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.num_scheduled_tokens[req.request_id] = num_new
            budget -= num_new
            if req.request_id in self._seen_by_worker:
                first_ids, *later_ids = self.kv.get_group_block_ids(req.request_id)
                out.cached_requests.append(
                    CachedRequestData(
                        req.request_id,
                        first_ids,
                        req.num_computed_tokens,
                        resumed=was_preempted,
                        new_token_ids=req.take_unsent_tokens(),
                        new_group_block_ids=later_ids,
                    )
                )
            else:
                self._seen_by_worker.add(req.request_id)
                req.take_unsent_tokens()  # output_token_ids below carries them
                first_ids, *later_ids = self.kv.get_group_block_ids(req.request_id)
                out.new_requests.append(
                    NewRequestData(
                        req.request_id,
                        req.prompt_token_ids,
                        list(req.output_token_ids),
                        req.sampling_params,
                        first_ids,
                        req.num_computed_tokens,
                        group_block_ids=later_ids,
                        lora=req.lora,
                        images=req.images,
                    )
                )
                req.images = [image.spans_only() for image in req.images]  # (the worker's now)
        self.waiting.extendleft(reversed(no_slot))

        for rid, (first_ids, *later_ids) in new_blocks.items():
            req = self.requests[rid]
            out.cached_requests.append(
                CachedRequestData(
                    rid,
                    first_ids,
                    req.num_computed_tokens,
                    resumed=False,
                    new_token_ids=req.take_unsent_tokens(),
                    new_group_block_ids=later_ids,
                )
            )
        if self.config.async_scheduling:
            for rid, num in out.num_scheduled_tokens.items():
                req = self.requests[rid]
                req.num_computed_tokens += num
                if req.num_computed_tokens == req.num_tokens + req.num_placeholders:
                    req.num_placeholders += 1  # this step samples a token for it
        out.requests = {rid: self.requests[rid] for rid in out.num_scheduled_tokens}
        preempted += priority_preempted
        out.preempted_ids = [r.request_id for r in preempted if r.status == RequestStatus.PREEMPTED]
        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        assert out.total_num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(self.running) <= self.config.max_num_seqs
        return out

    def _prefill_budget(self, budget: int) -> int:
        """Prompt tokens this step may take: `max_prefill_tokens_while_decoding`, or the
        pacer's cap if lower, when a running request decodes (its next token waits for the
        whole step), else the budget."""
        cap = prefill_cap(self.config.max_prefill_tokens_while_decoding, self.pacer)
        if not cap or cap >= budget:
            return budget
        for req in self.running:
            if req.num_tokens + req.num_placeholders - req.num_computed_tokens == 1:
                return cap
        return budget

    def _count_lookup(self, req: Request, num_hit_tokens: int) -> None:
        """A request's prefix-cache lookup at admission (once per admission)."""
        if req.status == RequestStatus.WAITING and req.first_scheduled_time is None:
            req.num_cached_prompt_tokens = num_hit_tokens
            req.first_scheduled_time = time.time()
        self.kv.stats.queries += req.num_tokens
        self.kv.stats.hits += num_hit_tokens
        self.kv.stats.requests += 1
        self.kv.stats.hit_requests += num_hit_tokens > 0

    def _drafts_to_verify(self, req: Request, num_new: int, budget: int) -> list[int]:
        """The draft tokens `req` verifies this step: its proposals, if it is decoding (one
        token to compute: the one sampled last), cut to the budget and to what max_tokens
        and the context leave room for. Taken off the request either way."""
        drafts, req.spec_token_ids = req.spec_token_ids, []
        if not drafts or num_new != 1:
            return []  # prefilling, or tokens were forced after the proposal was made
        room = budget - 1
        max_tokens = req.sampling_params.max_tokens
        if max_tokens is not None:  # a step yields up to len(drafts) + 1 tokens
            room = min(room, max_tokens - req.num_output_tokens - 1)
        room = min(room, self.config.max_model_len - req.num_tokens - 1)
        return drafts[: max(room, 0)]

    def _order_waiting(self) -> None:
        if len(self.waiting) > 1:
            self.policy.order(
                self.waiting, self.step_count, self.kv.cached_prefix_len, self.kv.block_size
            )

    def _preempt_for_priority(self) -> list[Request]:
        """Make room for the best waiting request if a running one has a larger priority
        value and there is no room (sequence slots or blocks for its first chunk)."""
        victims = []
        bs = self.kv.block_size
        while self.waiting and self.running:
            cand = self.waiting[0]
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            if cand.priority >= victim.priority:
                break
            first_chunk = min(
                cand.num_tokens - cand.num_computed_tokens, self.config.max_num_batched_tokens
            )
            need = (-(-first_chunk // bs) + 1) * self.kv.num_groups  # (a list per KV group)
            if len(self.running) < self.config.max_num_seqs and self.kv.num_free_blocks >= need:
                break
            self._preempt(victim, reason="a higher-priority request is waiting")
            victims.append(victim)
        if victims:
            self._order_waiting()  # the victims joined at the front; priority decides
        return victims

    def _pick_victim(self, first: int) -> Request:
        """Lowest priority (largest value), then latest arrival, among running[first:]."""
        return max(self.running[first:], key=lambda r: (r.priority, r.arrival_time))

    def _preempt(self, req: Request, reason: str = "out of KV blocks") -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.spec_token_ids = []
        recompute = req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        req.enqueue_step = self.step_count
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        logger.info(
            "preempted %s (%s): %d tokens will be recomputed", req.request_id, reason, recompute
        )

    def update(
        self,
        sched: SchedulerOutput,
        result: SampledTokens,
        grammar: GrammarVerdicts | None = None,
    ) -> list[RequestUpdate]:
        """Advance computed counts, append sampled tokens, finish what must finish.
        `grammar`: what the structured-output grammars said of those tokens."""
        grammar = grammar or NO_VERDICTS
        updates: list[RequestUpdate] = []
        async_mode = self.config.async_scheduling
        for rid, num in sched.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None or req is not sched.requests.get(rid, req):
                continue  # finished or aborted since it was scheduled (its id maybe reused)
            if async_mode:
                # Counted at schedule time. A request preempted since then still gets the
                # token it sampled (it is real output); it recomputes everything later.
                if req.status not in (RequestStatus.RUNNING, RequestStatus.PREEMPTED):
                    continue
            elif req.status != RequestStatus.RUNNING:
                continue  # aborted between schedule and update
            else:
                req.num_computed_tokens += num
            token = result.sampled.get(rid)
            if token is None:
                continue  # a prefill chunk that did not reach the prompt's end
            if async_mode:
                req.num_placeholders -= 1
            new_tokens = [*result.accepted_drafts.get(rid, ()), token]
            drafts = sched.spec_token_ids.get(rid)
            if drafts:
                # Rejected drafts' K/V is not the request's: compute from the first of them.
                req.num_computed_tokens -= len(drafts) - (len(new_tokens) - 1)
                self.spec_stats.record(len(drafts), len(new_tokens) - 1)
            status = None
            for n_kept, t in enumerate(new_tokens, 1):
                req.append_output_token(t)
                status = self._check_stop(req, t)
                if status is not None:
                    del new_tokens[n_kept:]  # a stop among accepted drafts ends it there
                    break
            lps = result.logprobs.get(rid)
            if status is None:
                proposals = grammar.proposals if rid in grammar.proposals else result.proposals
                req.spec_token_ids = proposals.get(rid, [])
            if status is None and rid in grammar.done:
                status = RequestStatus.FINISHED_STOPPED  # the grammar matched in full
            for forced in grammar.forced.get(rid, ()) if status is None else ():
                req.append_output_token(forced, sampled=False)
                new_tokens.append(forced)
                status = self._check_stop(req, forced)
                if status is not None:
                    break
            if status == RequestStatus.FINISHED_STOPPED and rid in grammar.violated:
                status = RequestStatus.FINISHED_INVALID  # never a success that breaks the schema
            if status is not None:
                (self.running if req.status == RequestStatus.RUNNING else self.waiting).remove(req)
                self._finish(req, status)
            updates.append(
                RequestUpdate(
                    rid,
                    new_tokens,
                    lps[: len(new_tokens)] if lps is not None else None,
                    finish_reason=None if status is None else FINISH_REASONS[status],
                    stop_reason=req.stop_reason,
                    num_cached_tokens=req.num_cached_prompt_tokens,
                    first_scheduled_time=req.first_scheduled_time
                    if req.num_output_tokens == len(new_tokens)
                    else None,
                    new_prompt_logprobs=result.prompt_logprobs.get(rid),
                    embedding=result.embeddings.get(rid),
                )
            )
        return updates

    def _ends_with_placeholder(self, req: Request) -> bool:
        """The token in flight is its last whatever it is (max_tokens or the context):
        computing another step for it would be wasted."""
        planned = req.num_tokens + req.num_placeholders
        max_tokens = req.sampling_params.max_tokens
        if max_tokens is not None and req.num_output_tokens + req.num_placeholders >= max_tokens:
            return True
        return planned >= self.config.max_model_len

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        n_out = req.num_output_tokens
        is_eos = not params.ignore_eos and token in req.eos_token_ids
        if (is_eos or token in params.stop_token_ids) and n_out >= params.min_tokens:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and n_out >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if status != RequestStatus.FINISHED_ABORTED:
            self.remote.on_finish(req)  # a prefill engine stages the prompt's K/V
        self.kv.free(req)
        del self.requests[req.request_id]
        self._seen_by_worker.discard(req.request_id)
        self._finished_ids.append(req.request_id)

    def stats(self) -> SchedulerStats:
        preempted = 0
        if self.num_preemptions:  # (a walk of the waiting queue only once any happened)
            preempted = sum(r.status == RequestStatus.PREEMPTED for r in self.waiting)
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting) + self.remote.num_held,
            num_preempted=preempted,
            kv_blocks_cached=self.kv.num_cached_free_blocks,
            kv_usage=self.kv.usage,
            num_preemptions=self.num_preemptions,
            prefix_queries=self.kv.stats.queries,
            prefix_hits=self.kv.stats.hits,
            prefix_requests=self.kv.stats.requests,
            prefix_hit_requests=self.kv.stats.hit_requests,
            prefix_evictions=self.kv.num_evictions,
            spec=self.spec_stats,
            kv_transfer=self.remote.stats,
            lora=self.loras.stats(self.running, self.waiting) if self.loras else None,
        )
