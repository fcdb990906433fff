"""Token ids in, text out: incremental detokenization, stop strings, and n-sample fan-in.

One `RequestState` per user request; its `n` samples run in the core as separate sequences
named `{request_id}#{i}`, which share the prompt's KV blocks through the prefix cache.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Protocol

from cadence.core.scheduler import RequestUpdate
from cadence.outputs import CompletionOutput, RequestMetrics, RequestOutput
from cadence.sampling_params import SamplingParams

# Prompt tokens decoded ahead of the output, so a word-initial space survives the cut.
_PREFIX_TOKENS = 5


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
        out.append(child)
    return out


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into text, emitting only complete characters."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.tokens = list(prompt_token_ids[-_PREFIX_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def push(self, new_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        self.tokens.extend(new_ids)
        decode = self.tokenizer.decode
        before = decode(
            self.tokens[self.prefix_offset : self.read_offset],
            skip_special_tokens=self.skip_special,
        )
        after = decode(self.tokens[self.prefix_offset :], skip_special_tokens=self.skip_special)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            return after[len(before) :]
        return ""  # an incomplete UTF-8 sequence: wait for the next token


@dataclass
class SampleState:
    output: CompletionOutput
    detok: IncrementalDetokenizer
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
    stop_max_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.stop_max_len = max((len(s) for s in self.params.stop), default=0)

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
        )


class RequestObserver(Protocol):
    """Per-request timings, for metrics (the server passes one; the offline API does not)."""

    def on_first_token(
        self, ttft: float, queue_time: float | None, num_prompt_tokens: int
    ) -> None: ...
    def on_token(self, inter_token_latency: float) -> None: ...
    def on_new_tokens(self, num_tokens: int) -> None: ...
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
                IncrementalDetokenizer(
                    self.tokenizer, prompt_token_ids, params.skip_special_tokens
                ),
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
        core because a stop string ended them)."""
        now = time.time()
        changed: dict[str, RequestState] = {}
        to_stop: list[str] = []
        for up in updates:
            entry = self._child.get(up.request_id)
            if entry is None:
                continue
            state, index = entry
            sample = state.samples[index]
            out = sample.output
            if out.finished:
                continue
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
            elif obs is not None and m.last_token_time is not None:
                obs.on_token(now - m.last_token_time)
            m.last_token_time = now
            if obs is not None:
                obs.on_new_tokens(len(up.new_token_ids))
            state.num_cached_tokens = max(state.num_cached_tokens, up.num_cached_tokens)
            out.token_ids.extend(up.new_token_ids)
            if up.new_logprobs is not None and out.logprobs is not None:
                for tok, (lp, top) in zip(up.new_token_ids, up.new_logprobs):
                    entry_lp = dict(top)
                    entry_lp[tok] = lp
                    out.logprobs.append(entry_lp)
                    out.cumulative_logprob += lp
            incremental = self.streaming or bool(state.params.stop)
            if incremental:
                out.text += sample.detok.push(up.new_token_ids)
            if up.finished:
                out.finish_reason = up.finish_reason
                out.stop_reason = up.stop_reason
                if not incremental and self.tokenizer is not None:
                    out.text = self.tokenizer.decode(
                        out.token_ids, skip_special_tokens=state.params.skip_special_tokens
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
        return list(changed.values()), to_stop

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
