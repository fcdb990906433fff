"""/v1/messages: the Anthropic Messages API over the chat path (serving_chat.py).

The answer is a message of content blocks (text, tool_use) with Anthropic's stop reasons:
end_turn (the model stopped), max_tokens, stop_sequence (with the sequence), tool_use.
Usage follows Anthropic's split: `input_tokens` are the prompt tokens computed now,
`cache_read_input_tokens` those the prefix cache supplied. A stream is Anthropic's named
events: message_start, per block content_block_start / content_block_delta (text_delta,
input_json_delta) / content_block_stop, then message_delta (stop reason, output tokens)
and message_stop.
"""

from __future__ import annotations

import json
import uuid
from contextlib import aclosing
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from cadence.engine.output_processor import RequestState
from cadence.entrypoints.errors import APIError, validation_message
from cadence.entrypoints.messages_protocol import MessagesRequest, to_chat
from cadence.entrypoints.openai_protocol import ChatCompletionRequest
from cadence.entrypoints.serving import finish_reason, raise_if_aborted
from cadence.entrypoints.serving_chat import ChatJob, ChatServing
from cadence.entrypoints.streaming import sse_event
from cadence.entrypoints.tool_calls import message_from_output


def _tool_use_id(call_id: str) -> str:
    """Anthropic's tool_use ids (toolu_...) for the chat path's call ids (call_...)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(
    finish: str | None, stop: int | str | None, called: bool
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for the chat path's finish reason, the engine's stop
    reason (a stop string or token id) and whether the answer holds a tool call."""
    raise_if_aborted(finish)
    if finish == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


class MessagesServing:
    def __init__(self, chat: ChatServing) -> None:
        self.chat = chat

    async def create(self, req: MessagesRequest):
        job = await self.chat.prepare(
            _translate(req), rid=f"msg_{uuid.uuid4().hex}", budget_is_hint=True
        )
        if req.stream:
            return self._stream(job)
        final = await self.chat.complete(job)
        out = final.samples[0].output
        thinking, answer = self.chat.split(out.text)
        message, calls = message_from_output(job.plan, answer)
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for c in calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": _tool_use_id(c.id),
                    "name": c.name,
                    "input": _tool_input(c.arguments),
                }
            )
        reason, sequence = stop_reason(out.finish_reason, out.stop_reason, bool(calls))
        return {
            **self._message(job, final),
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
        }

    async def count_tokens(self, req: MessagesRequest) -> dict[str, int]:
        """POST /v1/messages/count_tokens: the prompt's tokens, as /v1/messages would see it."""
        chat_req = _translate(req)
        self.chat.check_model(chat_req.model)
        _, (ids, _) = await self.chat.render(chat_req)
        return {"input_tokens": len(ids)}

    def _message(self, job: ChatJob, state: RequestState | None) -> dict[str, Any]:
        prompt = len(job.prompt.token_ids)
        cached = state.num_cached_tokens if state is not None else 0
        output = sum(len(s.output.token_ids) for s in state.samples) if state else 0
        return {
            "id": job.rid,
            "type": "message",
            "role": "assistant",
            "model": self.chat.served_name(job.prompt),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt - cached,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached,
                "output_tokens": output,
            },
        }

    async def _stream(self, job: ChatJob):
        with self.chat.admitted(job) as ticket:
            start = {"type": "message_start", "message": self._message(job, None)}
            yield sse_event("message_start", start)
            blocks = _Blocks()
            final = finish = stop = None
            async with aclosing(self.chat.deltas(job, ticket)) as deltas:
                async for d in deltas:
                    final = d.state
                    for piece in blocks.feed(d.deltas):
                        yield piece
                    if d.finished:
                        finish = finish_reason(d.state.samples[0].output.finish_reason)
                        stop = d.stop_reason
            for piece in blocks.close():
                yield piece
            reason, sequence = stop_reason(finish, stop, blocks.called)
            usage = self._message(job, final)["usage"]
            yield sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage,
                },
            )
            yield sse_event("message_stop", {"type": "message_stop"})


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object; cut short by max_tokens, as much as parses."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        try:
            value = from_json(arguments, allow_partial="trailing-strings")
        except ValueError:
            value = {}
    return value if isinstance(value, dict) else {}


def _translate(req: MessagesRequest) -> ChatCompletionRequest:
    try:
        return to_chat(req)
    except ValidationError as e:
        raise APIError(validation_message(e), param="messages") from None
    except ValueError as e:
        raise APIError(str(e), param="messages") from None


class _Blocks:
    """The content blocks of a streamed message as they open, grow and close."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the type of the open block
        self.called = False  # a tool_use block was sent

    def feed(self, deltas: list[dict]):
        """One step's chat deltas: text, or tool calls (a new one opens a tool_use block)."""
        for delta in deltas:
            if delta.get("reasoning_content"):
                yield from self.thinking(delta["reasoning_content"])
            if delta.get("content"):
                yield from self.text(delta["content"])
            for call in delta.get("tool_calls", []):
                yield from self.tool(call)

    def _start(self, block: dict):
        yield from self.close()
        self.index += 1
        self.open = block["type"]
        body = {"type": "content_block_start", "index": self.index, "content_block": block}
        yield sse_event("content_block_start", body)

    def _delta(self, delta: dict) -> str:
        body = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return sse_event("content_block_delta", body)

    def thinking(self, text: str):
        if self.open != "thinking":
            yield from self._start({"type": "thinking", "thinking": "", "signature": ""})
        yield self._delta({"type": "thinking_delta", "thinking": text})

    def text(self, text: str):
        if self.open != "text":
            yield from self._start({"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": text})

    def tool(self, call: dict):
        fn = call.get("function", {})
        if "id" in call:
            self.called = True
            block = {"type": "tool_use", "id": _tool_use_id(call["id"]), "name": fn.get("name", "")}
            yield from self._start({**block, "input": {}})
        args = fn.get("arguments") or ""
        if args and self.open == "tool_use":
            yield self._delta({"type": "input_json_delta", "partial_json": args})

    def close(self):
        if self.open is not None:
            self.open = None
            body = {"type": "content_block_stop", "index": self.index}
            yield sse_event("content_block_stop", body)
