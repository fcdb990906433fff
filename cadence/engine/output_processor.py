"""Token ids in, text out: incremental detokenization, stop strings, and n-sample fan-in.

One `RequestState` per user request; its `n` samples run in the core as separate sequences
named `{request_id}#{i}`, which share the prompt's KV blocks through the prefix cache.
Prompt logprobs are one per request: only sample 0 computes them.

An update that raises (a tokenizer error on one request, say) fails its own request only:
its samples end with finish_reason "error", their core ids come back as ids to stop, and
`take_failed()` names the request and the error; the rest of the message is applied.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from cadence.core.scheduler_output import RequestUpdate
from cadence.engine.detokenizer import Detokenizer, make_detokenizer
from cadence.outputs import CompletionOutput, RequestMetrics, RequestOutput
from cadence.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def child_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{request_id}#{index}"


def sample_params(params: SamplingParams) -> list[SamplingParams]:
    """The parameters of each of a request's n sequences in the core (n == 1 each)."""
    if params.n == 1:
        return [params]
    out = []
    for i in range(params.n):
        child = copy.deepcopy(params)
        child.n = 1
        if params.seed is not None:
            child.seed = params.seed + i  # n samples, n different draws
        if i > 0:
            # The samples share one prompt: one computes its logprobs, the others may take
            # its blocks from the prefix cache.
            child.prompt_logprobs = None
        out.append(child)
    return out


def _spoken(up: RequestUpdate, include_stop: bool) -> int:
    """How many of the update's tokens have text: all but the stop token (EOS or one of
    stop_token_ids) that ended the sample, unless include_stop_str_in_output (as vLLM;
    with special tokens kept, `<|im_end|>` would otherwise end every answer)."""
    ids = up.new_token_ids
    ended_by_token = up.finished and up.stop_reason is not None and bool(ids)
    if ended_by_token and not include_stop and ids[-1] == up.stop_reason:
        return len(ids) - 1
    return len(ids)


@dataclass
class SampleState:
    output: CompletionOutput
    detok: Detokenizer
    emitted_len: int = 0  # characters of output.text already streamed


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[SampleState]
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    # With params.prompt_logprobs: one entry per prompt token, {token id: logprob} for the
    # prompt token and the top k at its position; None for the first token. Empty until
    # the first output token arrives (it brings them all); None when not asked for.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    error: str | None = None  # why processing failed for it (see OutputProcessor.take_failed)
    embedding: bytes | None = None  # an embedding model's pooled prompt (raw float32)
    stop_max_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.stop_max_len = max((len(s) for s in self.params.stop), default=0)
        if self.prompt_logprobs is None and self.params.prompt_logprobs is not None:
            self.prompt_logprobs = []

    @property
    def finished(self) -> bool:
        return all(s.output.finished for s in self.samples)

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            [s.output for s in self.samples],
            self.finished,
            self.metrics,
            self.num_cached_tokens,
            self.prompt_logprobs,
            self.embedding,
        )


class RequestObserver(Protocol):
    """Per-request timings, for metrics (the server passes one; the offline API does not)."""

    def on_first_token(
        self, ttft: float, queue_time: float | None, num_prompt_tokens: int
    ) -> None: ...
    def on_tokens(self, num_tokens: int, inter_token_latencies: list[float]) -> None:
        """Once per engine message: the tokens it brought, and the gap before each token
        that was not a request's first (seconds)."""
        ...

    def on_finished(self, e2e: float, finish_reason: str) -> None: ...


class OutputProcessor:
    def __init__(
        self, tokenizer, observer: RequestObserver | None = None, streaming: bool = True
    ) -> None:
        """`streaming=False` (the offline API): text is decoded once at the end, unless a
        request has stop strings, which need the text as it grows."""
        self.tokenizer = tokenizer
        self.observer = observer
        self.streaming = streaming
        self.requests: dict[str, RequestState] = {}
        self._child: dict[str, tuple[RequestState, int]] = {}
        self._failed: list[tuple[str, str]] = []

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> list[str]:
        """Track a request; returns the ids of its samples as the core knows them."""
        samples = [
            SampleState(
                CompletionOutput(
                    i,
                    logprobs=[] if params.logprobs is not None else None,
                    cumulative_logprob=0.0 if params.logprobs is not None else None,
                ),
                make_detokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens),
            )
            for i in range(params.n)
        ]
        state = RequestState(
            request_id, prompt, prompt_token_ids, params, samples, RequestMetrics(arrival_time)
        )
        self.requests[request_id] = state
        ids = [child_id(request_id, i, params.n) for i in range(params.n)]
        for i, cid in enumerate(ids):
            self._child[cid] = (state, i)
        return ids

    def process(self, updates: list[RequestUpdate]) -> tuple[list[RequestState], list[str]]:
        """Apply a step's updates. Returns (states that changed, sample ids to stop in the
        core because a stop string ended them or their request failed). An update that
        raises fails its own request only (see `take_failed`)."""
        now = time.time()
        changed: dict[str, RequestState] = {}
        to_stop: list[str] = []
        num_new_tokens = 0
        gaps: list[float] = []  # inter-token latencies of this message's tokens
        for up in updates:
            entry = self._child.get(up.request_id)
            try:
                num_new_tokens += self._apply(up, now, changed, to_stop, gaps)
            except Exception as e:
                logger.exception("failed to process the update of %s", up.request_id)
                if entry is not None:
                    state, index = entry
                    state.samples[index].output.finish_reason = None  # it ends as failed
                    to_stop.extend(self._fail(state, f"{type(e).__name__}: {e}", now))
                    changed[state.request_id] = state
        if self.observer is not None and num_new_tokens:  # once a step, not once a request
            self.observer.on_tokens(num_new_tokens, gaps)
        return list(changed.values()), to_stop

    def take_failed(self) -> list[tuple[str, str]]:
        """(request id, error) of the requests whose update raised since the last call.
        Their samples ended with finish_reason "error" and their core ids were returned by
        `process` as ids to stop; the caller owes each one an error answer."""
        failed, self._failed = self._failed, []
        return failed

    def _fail(self, state: RequestState, message: str, now: float) -> list[str]:
        """End every unfinished sample of a request with an error; returns their core ids
        to stop (stopping one the core has finished meanwhile is a no-op there)."""
        state.error = message
        ids = []
        for i, s in enumerate(state.samples):
            cid = child_id(state.request_id, i, state.params.n)
            if self._child.pop(cid, None) is not None:
                ids.append(cid)
            if not s.output.finished:
                s.output.finish_reason = "error"
        self.requests.pop(state.request_id, None)
        state.metrics.finished_time = now
        self._failed.append((state.request_id, message))
        return ids

    def _apply(
        self,
        up: RequestUpdate,
        now: float,
        changed: dict[str, RequestState],
        to_stop: list[str],
        gaps: list[float],
    ) -> int:
        """Apply one sample's update; returns how many new tokens it brought (0: the sample
        is gone or had finished)."""
        entry = self._child.get(up.request_id)
        if entry is None:
            return 0
        state, index = entry
        sample = state.samples[index]
        out = sample.output
        if out.finished:
            return 0
        m = state.metrics
        obs = self.observer
        if m.first_token_time is None:
            m.first_token_time = now
            if obs is not None:
                queued = (
                    None
                    if up.first_scheduled_time is None
                    else up.first_scheduled_time - m.arrival_time
                )
                obs.on_first_token(now - m.arrival_time, queued, len(state.prompt_token_ids))
        elif m.last_token_time is not None:
            gaps.append(now - m.last_token_time)
        m.last_token_time = now
        state.num_cached_tokens = max(state.num_cached_tokens, up.num_cached_tokens)
        if up.new_prompt_logprobs is not None and index == 0:
            _extend_prompt_logprobs(state, up.new_prompt_logprobs)
        if up.embedding is not None:
            state.embedding = up.embedding
        out.token_ids.extend(up.new_token_ids)
        if up.new_logprobs is not None and out.logprobs is not None:
            for tok, (lp, top) in zip(up.new_token_ids, up.new_logprobs):
                entry_lp = dict(top)
                entry_lp[tok] = lp
                out.logprobs.append(entry_lp)
                out.cumulative_logprob += lp
        incremental = self.streaming or bool(state.params.stop)
        spoken = _spoken(up, state.params.include_stop_str_in_output)
        if incremental:
            out.text += sample.detok.push(up.new_token_ids[:spoken])
        if up.finished:
            out.finish_reason = up.finish_reason
            out.stop_reason = up.stop_reason
            if incremental:
                out.text += sample.detok.flush()
            elif self.tokenizer is not None:
                unspoken = len(up.new_token_ids) - spoken
                out.text = self.tokenizer.decode(
                    out.token_ids[: len(out.token_ids) - unspoken],
                    skip_special_tokens=state.params.skip_special_tokens,
                )
        if state.params.stop and not out.finished:
            hit = self._find_stop(state, out, len(up.new_token_ids))
            if hit:
                to_stop.append(up.request_id)
        changed[state.request_id] = state
        if out.finished:
            del self._child[up.request_id]
            if state.finished:
                m.finished_time = now
                del self.requests[state.request_id]
                if obs is not None:
                    obs.on_finished(now - m.arrival_time, out.finish_reason or "stop")
        return len(up.new_token_ids)

    def _find_stop(self, state: RequestState, out: CompletionOutput, num_new_tokens: int) -> bool:
        """End the sample at the first stop string in its text, which may straddle tokens."""
        params = state.params
        # Only the tail can hold a new match: new text plus a stop string's length.
        search_from = max(0, len(out.text) - (num_new_tokens * 64 + state.stop_max_len))
        best = None
        for stop in params.stop:
            idx = out.text.find(stop, search_from)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return False
        idx, stop = best
        out.text = (
            out.text[: idx + len(stop)] if params.include_stop_str_in_output else out.text[:idx]
        )
        out.finish_reason = "stop"
        out.stop_reason = stop
        return True

    def abort(self, request_id: str) -> list[str]:
        """Forget a request; returns its unfinished sample ids, for the core to abort."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return []
        ids = []
        for i, s in enumerate(state.samples):
            cid = child_id(request_id, i, state.params.n)
            if self._child.pop(cid, None) is not None:
                ids.append(cid)
            if not s.output.finished:
                s.output.finish_reason = "abort"
        return ids

    def streamable_text(self, state: RequestState, index: int) -> str:
        """New text of a sample that is safe to stream: a possible stop-string prefix at the
        end is held back until it is resolved."""
        s = state.samples[index]
        text = s.output.text
        limit = (
            len(text)
            if s.output.finished
            else max(s.emitted_len, len(text) - max(state.stop_max_len - 1, 0))
        )
        delta = text[s.emitted_len : limit]
        s.emitted_len = limit
        return delta


def _extend_prompt_logprobs(
    state: RequestState, entries: list[tuple[float, list[tuple[int, float]]] | None]
) -> None:
    """Append prompt-token entries from the wire as {token id: logprob} dicts (the top k
    and the prompt token itself), continuing where the last ones ended."""
    if state.prompt_logprobs is None:
        return  # not asked for (an engine that sends them anyway is ignored)
    plps = state.prompt_logprobs
    if len(plps) + len(entries) > len(state.prompt_token_ids):
        raise ValueError(
            f"{len(plps) + len(entries)} prompt logprobs for a prompt of "
            f"{len(state.prompt_token_ids)} tokens"
        )
    for entry in entries:
        if entry is None:
            plps.append(None)
            continue
        lp, top = entry
        d = dict(top)
        d[state.prompt_token_ids[len(plps)]] = lp
        plps.append(d)
