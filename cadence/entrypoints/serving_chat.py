"""/v1/chat/completions: messages through the chat template, tools, streamed or not.

The chat path is also the engine room of the other conversational APIs (/v1/responses,
/v1/messages): they translate their request into a ChatCompletionRequest, and run it here:

    job = await chat.prepare(req)            checks, template, tools, sampling: a ChatJob
    state = await chat.complete(job)         admitted, run to the end
    with chat.admitted(job) as ticket:       admitted (429 before any event goes out) ...
        async for d in chat.deltas(job, ticket):   ... each sample's news as a SampleDelta
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from cadence.engine.output_processor import RequestState
from cadence.entrypoints.errors import APIError
from cadence.entrypoints.openai_protocol import ChatCompletionRequest, now, random_id
from cadence.entrypoints.reasoning import ReasoningParser, split_reasoning
from cadence.entrypoints.serving import Prompt, Serving, finish_reason
from cadence.entrypoints.streaming import DONE, StreamCursor
from cadence.entrypoints.thinking_bounds import thinking_bounds
from cadence.entrypoints.tool_calls import (
    ToolCallStream,
    ToolPlan,
    message_from_output,
    plan_tools,
)
from cadence.entrypoints.tool_calls import finish_reason as tool_finish_reason
from cadence.entrypoints.tool_parsers import ToolParser
from cadence.entrypoints.tool_parsers.hermes import HermesToolParser
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams


@dataclass
class ChatJob:
    """A checked chat request, ready to run."""

    rid: str
    created: int  # unix seconds
    prompt: Prompt
    params: SamplingParams
    plan: ToolPlan
    top_logprobs: int | None  # None: no logprobs asked for
    priority: int


@dataclass
class SampleDelta:
    """What one sample of a streamed chat says next: OpenAI chat `delta` objects (thinking
    as reasoning_content, content, or tool_calls), and when it finished, why."""

    index: int
    deltas: list[dict[str, Any]]
    logprobs: dict | None  # the new tokens' logprobs, in chat's form
    finished: bool
    finish_reason: str | None  # OpenAI's (tool_calls when the model called), at the finish
    stop_reason: int | str | None  # the stop string or token id that ended it
    state: RequestState  # the request so far (usage)


class ChatServing(Serving):
    def __init__(
        self,
        *shared,
        reasoning: type[ReasoningParser] | None = None,
        tool_parser: type[ToolParser] = HermesToolParser,
    ) -> None:
        """`shared`: Serving's arguments; `reasoning`: the --reasoning-parser, if any;
        `tool_parser`: the format tool calls are read in."""
        super().__init__(*shared)
        self.reasoning = reasoning
        self.tool_parser = tool_parser
        self._end_ids: list[int] | None = None  # the reasoning end marker's token ids

    def usage(self, prompts: list[Prompt], states: list[RequestState | None]) -> dict:
        """Serving's usage, with the thinking's share of the completion tokens when a
        reasoning parser is on (completion_tokens_details.reasoning_tokens)."""
        out = super().usage(prompts, states)
        if self.reasoning is not None:
            samples = [s.output for st in states if st is not None for s in st.samples]
            thought = sum(self.reasoning_tokens(o.token_ids, o.text) for o in samples)
            out["completion_tokens_details"] = {"reasoning_tokens": thought}
        return out

    def reasoning_tokens(self, token_ids: list[int], text: str) -> int:
        """How many of a sample's tokens are thinking: up to the end marker, all of them
        when the thinking never ended, none when there was none."""
        if self.reasoning is None or not self.split(text)[0]:
            return 0
        end = self._end_marker_ids()
        for i in range(len(token_ids) - len(end) + 1) if end else ():
            if token_ids[i : i + len(end)] == end:
                return i + len(end)
        return len(token_ids)

    def _end_marker_ids(self) -> list[int]:
        if self._end_ids is None:
            marker, tokenizer = self.reasoning.end_marker, self.prompts.tokenizer
            ok = marker is not None and tokenizer is not None
            self._end_ids = tokenizer.encode(marker, add_special_tokens=False) if ok else []
        return self._end_ids

    def split(self, text: str) -> tuple[str, str]:
        """A finished sample's (thinking, answer)."""
        return ("", text) if self.reasoning is None else split_reasoning(self.reasoning(), text)

    async def prepare(
        self, req: ChatCompletionRequest, rid: str | None = None, budget_is_hint: bool = False
    ) -> ChatJob:
        """Check and tokenize a chat request; `rid` names it (default: a chatcmpl- id).
        `budget_is_hint`: a max_thinking_tokens this server cannot keep is dropped rather
        than refused (Anthropic clients send a budget whenever thinking is on)."""
        lora = self.check_model(req.model)
        self.check_transfer(req)
        plan, (ids, images) = await self.render(req)
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        top = None
        if req.logprobs:
            top = req.top_logprobs or 0
        elif req.top_logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        params = self.sampling_params(req, max_tokens, top, len(ids))
        if (self.reasoning is not None and self.reasoning.needs_special_tokens) or (
            plan.in_prompt and plan.parser.needs_special_tokens
        ):
            params.skip_special_tokens = False  # their markers are special tokens
        forced = plan.constraint()
        if forced is not None:
            if params.structured_outputs is not None:
                raise APIError(
                    "a forced tool call (tool_choice required or a named function) cannot be "
                    "combined with response_format or structured outputs",
                    param="tool_choice",
                )
            params.structured_outputs = forced
        # A reasoning model's constraint is for its answer, after the thinking.
        bound = functools.partial(
            thinking_bounds, self.reasoning, self.prompts.tokenizer, ids, params.structured_outputs
        )
        try:
            params.structured_outputs = bound(req.max_thinking_tokens)
        except ValueError as e:
            if not budget_is_hint:
                raise APIError(str(e), param="max_thinking_tokens") from e
            params.structured_outputs = bound(None)
        self.admission.check_size(params.n, [len(ids)])
        await self.check_structured(params, "tools" if forced is not None else None)
        rid = rid or random_id("chatcmpl")
        prompt = Prompt(None, ids, lora, images)
        return ChatJob(rid, now(), prompt, params, plan, top, req.priority)

    async def render(
        self, req: ChatCompletionRequest
    ) -> tuple[ToolPlan, tuple[list[int], list[ImageInput]]]:
        """The request's tool plan, and its conversation through the template as ids (and
        its images)."""
        try:
            plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, self.tool_parser)
        except ValueError as e:
            raise APIError(str(e), param="tool_choice") from e
        prompt = await self.prompts.chat(
            req.messages,
            req.add_generation_prompt,
            req.continue_final_message,
            req.chat_template_kwargs,
            plan.tools if plan.in_prompt else None,
        )
        return plan, prompt

    def admitted(self, job: ChatJob):
        """Hold the job's place (a context manager yielding the admission ticket)."""
        return self.admission.admit(job.params.n, [len(job.prompt.token_ids)])

    async def complete(self, job: ChatJob) -> RequestState:
        with self.admitted(job) as ticket:
            return await self.final(job.rid, job.prompt, job.params, job.priority, ticket.started)

    async def deltas(self, job: ChatJob, ticket) -> AsyncIterator[SampleDelta]:
        """Each sample's news as it arrives: text through its tool-call shaper (a tool call
        comes out as `tool_calls` deltas, never as raw text), logprobs, the finish."""
        cursor = StreamCursor(self.client.output_processor, job.params.n)
        shapers = [ToolCallStream(job.plan) for _ in range(job.params.n)]
        thinkers = [self.reasoning() if self.reasoning else None for _ in range(job.params.n)]
        top = job.top_logprobs
        async for state in self.run(job.rid, job.prompt, job.params, job.priority, ticket.started):
            for out, text, new_ids, new_lps, finished in cursor.deltas(state):
                lp = None
                if top is not None and new_ids:
                    lp = {"content": self.logprobs.chat(new_ids, new_lps, top)}
                shaper, thinker = shapers[out.index], thinkers[out.index]
                thinking, answer = ("", text) if thinker is None else thinker.feed(text)
                if finished and thinker is not None:
                    more, rest = thinker.finish()
                    thinking, answer = thinking + more, answer + rest
                deltas = (
                    [{"reasoning_content": thinking, "reasoning": thinking}] if thinking else []
                )
                deltas += shaper.feed(answer)
                reason = None
                if finished:
                    deltas += shaper.finish()
                    reason = tool_finish_reason(
                        job.plan, shaper.calls, finish_reason(out.finish_reason)
                    )
                yield SampleDelta(out.index, deltas, lp, finished, reason, out.stop_reason, state)

    # ---- /v1/chat/completions -------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest):
        job = await self.prepare(req)
        if req.stream:
            return self._stream(req, job)
        final = await self.complete(job)
        choices = []
        for s in final.samples:
            out = s.output
            thinking, answer = self.split(out.text)
            message, calls = message_from_output(job.plan, answer)
            if thinking:
                message["reasoning_content"] = message["reasoning"] = thinking
            choices.append(
                {
                    "index": out.index,
                    "message": message,
                    "logprobs": {
                        "content": self.logprobs.chat(out.token_ids, out.logprobs, job.top_logprobs)
                    }
                    if req.logprobs
                    else None,
                    "finish_reason": tool_finish_reason(
                        job.plan, calls, finish_reason(out.finish_reason)
                    ),
                    "stop_reason": out.stop_reason,
                }
            )
        return {
            "id": job.rid,
            "object": "chat.completion",
            "created": job.created,
            "model": self.served_name(job.prompt),
            "choices": choices,
            "usage": self.usage([job.prompt], [final]),
        }

    async def _stream(self, req: ChatCompletionRequest, job: ChatJob):
        # Admission first: a full server answers 429 before any chunk (and status 200) goes out.
        with self.admitted(job) as ticket:
            async for piece in self._chunks(req, job, ticket):
                yield piece

    async def _chunks(self, req: ChatCompletionRequest, job: ChatJob, ticket):
        stream_options = req.stream_options
        include_usage = bool(stream_options and stream_options.include_usage)
        continuous = bool(stream_options and stream_options.continuous_usage_stats)
        state = None

        def chunk(choices, usage=None):
            if continuous and usage is None:
                usage = self.usage([job.prompt], [state])
            return self.chunk(
                job.rid,
                "chat.completion.chunk",
                job.created,
                choices,
                usage,
                self.served_name(job.prompt),
            )

        for i in range(job.params.n):
            role = {"role": "assistant", "content": ""}
            yield chunk([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}])
        async with aclosing(self.deltas(job, ticket)) as news:
            async for d in news:
                state = d.state
                for i, delta in enumerate(d.deltas or ([{}] if d.logprobs else [])):
                    # (held-back text: its logprobs still go out now, on an empty delta)
                    lp = d.logprobs if i == 0 else None
                    yield chunk(
                        [{"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": None}]
                    )
                if d.finished:
                    last = {
                        "index": d.index,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": d.finish_reason,
                        "stop_reason": d.stop_reason,
                    }
                    yield chunk([last])
        if include_usage and state is not None:
            yield chunk([], self.usage([job.prompt], [state]))
        yield DONE
