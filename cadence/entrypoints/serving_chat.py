"""/v1/chat/completions: messages through the chat template, tools, streamed or not."""

from __future__ import annotations

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.openai_protocol import ChatCompletionRequest, now, random_id
from cadence.entrypoints.serving import Prompt, Serving, finish_reason
from cadence.entrypoints.streaming import DONE, StreamCursor
from cadence.entrypoints.tool_calls import (
    ToolCallStream,
    ToolPlan,
    message_from_output,
    plan_tools,
)
from cadence.entrypoints.tool_calls import finish_reason as tool_finish_reason


class ChatServing(Serving):
    async def chat(self, req: ChatCompletionRequest):
        self.check_model(req.model)
        self.check_transfer(req)
        try:
            plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
        except ValueError as e:
            raise APIError(str(e), param="tool_choice") from e
        ids = await self.prompts.chat(
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
        params = self.sampling_params(req, max_tokens, top, len(ids))
        forced = plan.constraint()
        if forced is not None:
            if params.structured_outputs is not None:
                raise APIError(
                    "a forced tool call (tool_choice required or a named function) cannot be "
                    "combined with response_format or structured outputs",
                    param="tool_choice",
                )
            params.structured_outputs = forced
        self.admission.check_size(params.n, [len(ids)])
        await self.check_structured(params, "tools" if forced is not None else None)
        rid = random_id("chatcmpl")
        created = now()
        if req.stream:
            return self._stream(req, rid, created, prompt, params, plan)
        with self.admission.admit(params.n, [len(ids)]) as ticket:
            final = await self.final(rid, prompt, params, req.priority, ticket.started)
        choices = []
        for s in final.samples:
            out = s.output
            message, calls = message_from_output(plan, out.text)
            choices.append(
                {
                    "index": out.index,
                    "message": message,
                    "logprobs": {"content": self.logprobs.chat(out.token_ids, out.logprobs, top)}
                    if req.logprobs
                    else None,
                    "finish_reason": tool_finish_reason(
                        plan, calls, finish_reason(out.finish_reason)
                    ),
                    "stop_reason": out.stop_reason,
                }
            )
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": self.model_name,
            "choices": choices,
            "usage": self.usage([prompt], [final]),
        }

    async def _stream(self, req, rid, created, prompt, params, plan: ToolPlan):
        # Admission first: a full server answers 429 before any chunk (and status 200) goes out.
        with self.admission.admit(params.n, [len(prompt.token_ids)]) as ticket:
            async for piece in self._stream_admitted(
                req, rid, created, prompt, params, plan, ticket
            ):
                yield piece

    async def _stream_admitted(self, req, rid, created, prompt, params, plan, ticket):
        stream_options = req.stream_options
        include_usage = bool(stream_options and stream_options.include_usage)
        continuous = bool(stream_options and stream_options.continuous_usage_stats)
        top = params.logprobs
        state = None

        def chunk(choices, usage=None):
            if continuous and usage is None:
                usage = self.usage([prompt], [state])
            return self.chunk(rid, "chat.completion.chunk", created, choices, usage)

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
        cursor = StreamCursor(self.client.output_processor, params.n)
        shapers = [ToolCallStream(plan) for _ in range(params.n)]
        async for state in self.run(rid, prompt, params, req.priority, ticket.started):
            for out, delta, new_ids, new_lps, finished in cursor.deltas(state):
                lp = None
                if req.logprobs and new_ids:
                    lp = {"content": self.logprobs.chat(new_ids, new_lps, top)}
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
                    reason = tool_finish_reason(
                        plan, shaper.calls, finish_reason(out.finish_reason)
                    )
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
            yield chunk([], self.usage([prompt], [state]))
        yield DONE
