"""/v1/completions and /v1/chat/completions: from a validated request to a response or an
SSE stream. Tokenizing and chat templates happen here, in the API server process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from cadence.engine.client import AsyncEngineClient
from cadence.engine.output_processor import RequestState
from cadence.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    UsageInfo,
    now,
    random_id,
)
from cadence.entrypoints.tool_calls import (
    ToolCallStream,
    ToolPlan,
    conversation_for_template,
    message_from_output,
    plan_tools,
    render_without_template_support,
    template_supports_tools,
    tools_for_template,
)
from cadence.entrypoints.tool_calls import finish_reason as tool_finish_reason
from cadence.sampling_params import SamplingParams
from cadence.structured.grammar import to_grammar


class APIError(Exception):
    """An error for the client: becomes {"error": {...}} with this HTTP status."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code or self.status,
            }
        }


@dataclass
class Prompt:
    text: str | None
    token_ids: list[int]


class Serving:
    """Shared by both endpoints: the client, the tokenizer, the served name, the limits."""

    def __init__(
        self,
        client: AsyncEngineClient,
        tokenizer,
        served_model_name: str,
        max_model_len: int,
        admission,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.admission = admission

    # ---- checks -----------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                f"The model `{model}` does not exist. Serving: `{self.model_name}`.",
                404,
                "NotFoundError",
                "model",
                "model_not_found",
            )

    def _params(
        self, req, max_tokens: int | None, logprobs: int | None, prompt_len: int
    ) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if room < 1:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"prompt has {prompt_len} tokens, leaving no room for a completion.",
                param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} "
                "for the completion). Please reduce the prompt or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        try:
            params = req.to_sampling_params(max_tokens, logprobs, room)
            params.verify(self.client.ready.vocab_size)
        except ValueError as e:
            raise APIError(str(e)) from e
        return params

    def _check_ids(self, ids: list[int]) -> None:
        vocab = self.client.ready.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise APIError(
                    f"token id {t} is outside the vocabulary [0, {vocab})", param="prompt"
                )

    # ---- prompts ----------------------------------------------------------------------

    def completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        p = req.prompt
        if isinstance(p, str):
            items: list = [p]
        elif all(isinstance(x, int) for x in p):
            items = [p]
        else:
            items = list(p)
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(Prompt(item, self.encode(item)))
            else:
                if not item:
                    raise APIError("prompt must not be empty", param="prompt")
                self._check_ids(item)
                out.append(Prompt(None, list(item)))
        if not out:
            raise APIError("prompt must not be empty", param="prompt")
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise APIError("this model has no tokenizer: send token ids")
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if not ids:
            raise APIError("prompt must not be empty", param="prompt")
        return ids

    def chat_prompt(
        self,
        messages,
        add_generation_prompt=True,
        continue_final=False,
        kwargs=None,
        tools: list | None = None,
    ) -> list[int]:
        """Token ids of the conversation through the chat template; `tools` (ChatTool list)
        go to a template that knows tools, or into the system message of one that does not."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise APIError("this model has no chat template; use /v1/completions")
        conv = []
        for m in messages:
            entry = {"role": m.role, "content": m.text()}
            if m.name:
                entry["name"] = m.name
            if m.tool_calls:
                entry["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id:
                entry["tool_call_id"] = m.tool_call_id
            conv.append(entry)
        kwargs = dict(kwargs or {})
        uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in messages)
        if uses_tools and template_supports_tools(self.tokenizer):
            conv = conversation_for_template(conv)
            if tools:
                kwargs["tools"] = tools_for_template(tools)
        elif uses_tools:
            conv = render_without_template_support(conv, tools)
        try:
            ids = self.tokenizer.apply_chat_template(
                conv,
                add_generation_prompt=add_generation_prompt and not continue_final,
                continue_final_message=continue_final,
                tokenize=True,
                **kwargs,
            )
        except Exception as e:  # a template may raise on a role order it does not allow
            raise APIError(f"cannot apply the chat template: {e}", param="messages") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    # ---- generation -------------------------------------------------------------------

    async def _run(
        self,
        rid: str,
        prompt: Prompt,
        params: SamplingParams,
        priority: int,
        admitted: Callable[[], None] | None = None,
    ) -> AsyncIterator[RequestState]:
        """The request's states as tokens arrive, inside admission control (429 when full).
        `admitted`: the `started` callback of an admission the caller already holds."""
        if admitted is None:
            with self.admission.admit(len(prompt.token_ids)) as started:
                async for state in self._run(rid, prompt, params, priority, started):
                    yield state
            return
        async for state in self.client.generate(
            rid, prompt.text, prompt.token_ids, params, priority
        ):
            admitted()
            yield state

    async def _final(
        self, rid: str, prompt: Prompt, params: SamplingParams, priority: int
    ) -> RequestState:
        final = None
        async for state in self._run(rid, prompt, params, priority):
            final = state
        return final

    async def completions(self, req: CompletionRequest):
        self.check_model(req.model)
        if req.suffix:
            raise APIError("suffix is not supported", param="suffix")
        prompts = self.completion_prompts(req)
        params = [
            self._params(req, req.max_tokens, req.logprobs, len(p.token_ids)) for p in prompts
        ]
        await self._check_structured(params[0])
        base_id = random_id("cmpl")
        created = now()
        if req.stream:
            return self._stream_completions(req, base_id, created, prompts, params)
        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the rest
                tasks = [
                    group.create_task(self._final(f"{base_id}-{i}", prompt, p, req.priority))
                    for i, (prompt, p) in enumerate(zip(prompts, params))
                ]
        except BaseExceptionGroup as eg:
            raise eg.exceptions[0] from None
        states = [t.result() for t in tasks]
        choices = []
        usage = UsageInfo()
        for i, (prompt, state) in enumerate(zip(prompts, states)):
            usage.prompt_tokens += len(prompt.token_ids)
            for s in state.samples:
                out = s.output
                usage.completion_tokens += len(out.token_ids)
                text = out.text
                prefix = ""
                if req.echo:
                    prefix = (
                        prompt.text if prompt.text is not None else self._decode(prompt.token_ids)
                    )
                choices.append(
                    {
                        "index": i * req.n + out.index,
                        "text": prefix + text,
                        "logprobs": self._completion_logprobs(
                            out.token_ids, out.logprobs, req.logprobs
                        )
                        if req.logprobs is not None
                        else None,
                        "finish_reason": _finish(out.finish_reason),
                        "stop_reason": out.stop_reason,
                    }
                )
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return {
            "id": base_id,
            "object": "text_completion",
            "created": created,
            "model": self.model_name,
            "choices": choices,
            "usage": usage.model_dump(exclude_none=True),
        }

    async def _stream_completions(self, req, base_id, created, prompts, params):
        usage = UsageInfo()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, usage_=None):
            return self._chunk(base_id, "text_completion", created, choices, usage_)

        # Every prompt runs at once; their chunks interleave as tokens arrive.
        cursors = [_StreamCursor(self.client.output_processor, p.n) for p in params]
        echoed = [[not req.echo] * p.n for p in params]
        finals: dict[int, object] = {}
        runs = [
            self._run(f"{base_id}-{i}", prompt, p, req.priority)
            for i, (prompt, p) in enumerate(zip(prompts, params))
        ]
        async for i, state in _merge(runs):
            prompt = prompts[i]
            finals[i] = state
            for out, delta, new_ids, new_lps, finished in cursors[i].deltas(state):
                if not echoed[i][out.index]:
                    delta = (
                        prompt.text if prompt.text is not None else self._decode(prompt.token_ids)
                    ) + delta
                    echoed[i][out.index] = True
                lp = None
                if req.logprobs is not None and new_ids:
                    lp = self._completion_logprobs(new_ids, new_lps, req.logprobs)
                yield chunk(
                    [
                        {
                            "index": i * req.n + out.index,
                            "text": delta,
                            "logprobs": lp,
                            "finish_reason": _finish(out.finish_reason) if finished else None,
                            "stop_reason": out.stop_reason if finished else None,
                        }
                    ]
                )
        usage.prompt_tokens = sum(len(p.token_ids) for p in prompts)
        usage.completion_tokens = sum(
            len(s.output.token_ids) for state in finals.values() for s in state.samples
        )
        if include_usage:
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            yield chunk([], usage.model_dump(exclude_none=True))
        yield "data: [DONE]\n\n"

    async def chat(self, req: ChatCompletionRequest):
        self.check_model(req.model)
        try:
            plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
        except ValueError as e:
            raise APIError(str(e), param="tool_choice") from e
        ids = self.chat_prompt(
            req.messages,
            req.add_generation_prompt,
            req.continue_final_message,
            req.chat_template_kwargs,
            plan.tools if plan.in_prompt else None,
        )
        prompt = Prompt(None, ids)
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        top = None
        if req.logprobs:
            top = req.top_logprobs or 0
        elif req.top_logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        params = self._params(req, max_tokens, top, len(ids))
        forced = plan.constraint()
        if forced is not None:
            if params.structured_outputs is not None:
                raise APIError(
                    "a forced tool call (tool_choice required or a named function) cannot be "
                    "combined with response_format or structured outputs",
                    param="tool_choice",
                )
            params.structured_outputs = forced
        await self._check_structured(params, "tools" if forced is not None else None)
        rid = random_id("chatcmpl")
        created = now()
        if req.stream:
            return self._stream_chat(req, rid, created, prompt, params, plan)
        final = await self._final(rid, prompt, params, req.priority)
        choices = []
        completion_tokens = 0
        for s in final.samples:
            out = s.output
            completion_tokens += len(out.token_ids)
            message, calls = message_from_output(plan, out.text)
            choices.append(
                {
                    "index": out.index,
                    "message": message,
                    "logprobs": {"content": self._chat_logprobs(out.token_ids, out.logprobs, top)}
                    if req.logprobs
                    else None,
                    "finish_reason": tool_finish_reason(plan, calls, _finish(out.finish_reason)),
                    "stop_reason": out.stop_reason,
                }
            )
        usage = UsageInfo(
            prompt_tokens=len(ids),
            completion_tokens=completion_tokens,
            total_tokens=len(ids) + completion_tokens,
        )
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": self.model_name,
            "choices": choices,
            "usage": usage.model_dump(exclude_none=True),
        }

    async def _check_structured(self, params: SamplingParams, param: str | None = None) -> None:
        """Parse the request's grammar here (off the event loop) so a bad schema, regex or
        EBNF is a 400 before anything is queued."""
        so = params.structured_outputs
        if so is None:
            return
        try:
            await asyncio.to_thread(to_grammar, so)
        except ValueError as e:
            raise APIError(str(e), param=param or "response_format") from e

    async def _stream_chat(self, req, rid, created, prompt, params, plan: ToolPlan):
        # Admission first: a full server answers 429 before any chunk (and status 200) goes out.
        with self.admission.admit(len(prompt.token_ids)) as started:
            async for piece in self._stream_chat_admitted(
                req, rid, created, prompt, params, plan, started
            ):
                yield piece

    async def _stream_chat_admitted(self, req, rid, created, prompt, params, plan, started):
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        top = params.logprobs

        def chunk(choices, usage_=None):
            return self._chunk(rid, "chat.completion.chunk", created, choices, usage_)

        for i in range(params.n):
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        cursor = _StreamCursor(self.client.output_processor, params.n)
        shapers = [ToolCallStream(plan) for _ in range(params.n)]
        state = None
        async for state in self._run(rid, prompt, params, req.priority, started):
            for out, delta, new_ids, new_lps, finished in cursor.deltas(state):
                lp = None
                if req.logprobs and new_ids:
                    lp = {"content": self._chat_logprobs(new_ids, new_lps, top)}
                shaper = shapers[out.index]
                deltas = shaper.feed(delta)
                if finished:
                    deltas += shaper.finish()
                if lp and not deltas:
                    deltas = [{}]  # held-back text: the logprobs still go out now
                for i, d in enumerate(deltas):
                    yield chunk(
                        [
                            {
                                "index": out.index,
                                "delta": d,
                                "logprobs": lp if i == 0 else None,
                                "finish_reason": None,
                            }
                        ]
                    )
                if finished:
                    reason = tool_finish_reason(plan, shaper.calls, _finish(out.finish_reason))
                    yield chunk(
                        [
                            {
                                "index": out.index,
                                "delta": {},
                                "logprobs": None,
                                "finish_reason": reason,
                                "stop_reason": out.stop_reason,
                            }
                        ]
                    )
        if include_usage and state is not None:
            ct = sum(len(s.output.token_ids) for s in state.samples)
            usage = UsageInfo(
                prompt_tokens=len(prompt.token_ids),
                completion_tokens=ct,
                total_tokens=len(prompt.token_ids) + ct,
            )
            yield chunk([], usage.model_dump(exclude_none=True))
        yield "data: [DONE]\n\n"

    def _chunk(self, rid: str, obj: str, created: int, choices: list, usage: dict | None) -> str:
        """One SSE event of a stream."""
        body = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": self.model_name,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return _sse(body)

    # ---- logprobs formats -------------------------------------------------------------

    def _token_str(self, tid: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{tid}"
        return self.tokenizer.decode([tid])

    def _decode(self, ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids)

    def _completion_logprobs(self, token_ids, logprobs, k):
        tokens, token_lps, tops = [], [], []
        for tid, lps in zip(token_ids, logprobs or []):
            tokens.append(self._token_str(tid))
            token_lps.append(lps.get(tid))
            ranked = sorted(lps.items(), key=lambda kv: -kv[1])[: max(k, 0)] if k else []
            tops.append({self._token_str(t): v for t, v in ranked} if k else None)
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": token_lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _chat_logprobs(self, token_ids, logprobs, k):
        content = []
        for tid, lps in zip(token_ids, logprobs or []):
            tok = self._token_str(tid)
            ranked = sorted(lps.items(), key=lambda kv: -kv[1])[: k or 0]
            content.append(
                {
                    "token": tok,
                    "logprob": lps.get(tid),
                    "bytes": list(tok.encode()),
                    "top_logprobs": [
                        {
                            "token": self._token_str(t),
                            "logprob": v,
                            "bytes": list(self._token_str(t).encode()),
                        }
                        for t, v in ranked
                    ],
                }
            )
        return content


class _StreamCursor:
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


async def _merge(runs: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(index of the run, item) from several async iterators at once, as items arrive.
    The first error ends the merge; leaving it early (a hang-up) cancels every run, whose
    own cleanup then aborts its request in the engine."""
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


def _finish(reason: str | None) -> str | None:
    return None if reason is None else ("length" if reason == "length" else "stop")


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
