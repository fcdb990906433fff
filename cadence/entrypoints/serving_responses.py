"""/v1/responses: the OpenAI Responses API over the chat path (serving_chat.py).

Stateless by default: every request carries its whole conversation, the answer says
`"store": false`, and `previous_response_id` is a 400. With `--responses-store-size N` the
server keeps the last N responses (their conversation included) in memory, so
`previous_response_id` continues one and GET /v1/responses/{id} returns it; the oldest goes
first. A stream is the API's typed events, in order, each numbered by `sequence_number`:

    response.created, response.in_progress,
    per output item: response.output_item.added,
        a message: response.content_part.added, response.output_text.delta ...,
                   response.output_text.done, response.content_part.done
        a call:    response.function_call_arguments.delta ...,
                   response.function_call_arguments.done
        response.output_item.done,
    response.completed (or response.incomplete when max_output_tokens cut it short)
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from contextlib import aclosing
from typing import Any

from pydantic import ValidationError

from cadence.engine.output_processor import RequestState
from cadence.entrypoints.errors import APIError, validation_message
from cadence.entrypoints.responses_protocol import (
    RESPONSE_ID,
    ResponsesRequest,
    input_messages,
    to_chat,
)
from cadence.entrypoints.serving import raise_if_aborted
from cadence.entrypoints.serving_chat import ChatJob, ChatServing
from cadence.entrypoints.streaming import sse_event
from cadence.entrypoints.tool_calls import message_from_output


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseStore:
    """The last `capacity` responses and the conversations that led to them (in memory)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, body: dict, conversation: list[dict]) -> None:
        self._items[body["id"]] = (body, conversation)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]]:
        if not RESPONSE_ID.fullmatch(rid) or rid not in self._items:
            raise APIError(
                f"Response with id '{rid}' not found.", 404, "not_found_error", code="not_found"
            )
        return self._items[rid]

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self._items[rid]


class ResponsesServing:
    def __init__(self, chat: ChatServing, store: ResponseStore | None) -> None:
        self.chat = chat
        self.store = store

    def _usage(self, job: ChatJob, state: RequestState) -> dict:
        """Responses' usage; reasoning_tokens counted by the chat path's parser."""
        prompt = len(job.prompt.token_ids)
        outputs = [s.output for s in state.samples]
        output = sum(len(o.token_ids) for o in outputs)
        thought = sum(self.chat.reasoning_tokens(o.token_ids, o.text) for o in outputs)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": state.num_cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": prompt + output,
        }

    def _stored(self) -> ResponseStore:
        if self.store is None:
            raise APIError(
                "responses are not stored on this server (--responses-store-size)",
                404,
                "not_found_error",
                code="not_found",
            )
        return self.store

    def retrieve(self, rid: str) -> dict:
        return self._stored().get(rid)[0]

    def delete(self, rid: str) -> None:
        self._stored().delete(rid)

    async def create(self, req: ResponsesRequest):
        history: list[dict] = []
        if req.previous_response_id is not None:
            if self.store is None:
                raise APIError(
                    "previous_response_id needs the server's response store, which is off "
                    "(--responses-store-size); send the whole conversation in `input`",
                    param="previous_response_id",
                )
            history = self.store.get(req.previous_response_id)[1]
        try:
            chat_req = to_chat(req, history)
        except ValidationError as e:
            raise APIError(validation_message(e), param="input") from None
        except ValueError as e:
            raise APIError(str(e), param="input") from None
        job = await self.chat.prepare(chat_req, rid=_item_id("resp"))
        conversation = [m.model_dump(exclude_none=True) for m in chat_req.messages]
        if req.instructions:
            conversation = conversation[1:]  # instructions are not carried to the next turn
        if req.stream:
            return self._stream(req, job, conversation)
        final = await self.chat.complete(job)
        out = final.samples[0].output
        raise_if_aborted(out.finish_reason)
        thinking, answer = self.chat.split(out.text)
        message, calls = message_from_output(job.plan, answer)
        items = [_reasoning_item(_item_id("rs"), thinking, "completed")] if thinking else []
        if message.get("content"):
            lps = self._logprobs(job, out.token_ids, out.logprobs)
            items.append(_message_item(_item_id("msg"), message["content"], lps, "completed"))
        items += [_call_item(c.id, c.name, c.arguments, "completed") for c in calls]
        body = self._body(req, job, items, final, out.finish_reason)
        self._remember(req, body, conversation)
        return body

    def _logprobs(self, job: ChatJob, ids, lps) -> list[dict]:
        if job.top_logprobs is None:
            return []
        return self.chat.logprobs.chat(ids, lps, job.top_logprobs) or []

    def _remember(self, req: ResponsesRequest, body: dict, conversation: list[dict]) -> None:
        if self.store is None or req.store is False:
            return
        # The output items read back as input (a reasoning item is dropped there).
        turn = input_messages(body["output"])
        self.store.put(body, conversation + turn)

    def _body(
        self,
        req: ResponsesRequest,
        job: ChatJob,
        output: list[dict],
        state: RequestState | None,
        finish: str | None,
    ) -> dict[str, Any]:
        """The response object: in progress (state None), or finished for `finish`."""
        status, incomplete = "in_progress", None
        if state is not None:
            status = "incomplete" if finish == "length" else "completed"
            if finish == "length":
                incomplete = {"reason": "max_output_tokens"}
        fmt = {"type": "text"}
        if req.text is not None and req.text.format is not None:
            fmt = req.text.format.model_dump(by_alias=True, exclude_none=True)
        return {
            "id": job.rid,
            "object": "response",
            "created_at": job.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": self.chat.served_name(job.prompt),
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store is not None and req.store is not False,
            "temperature": job.params.temperature,
            "text": {"format": fmt},
            "tool_choice": _tool_choice(req),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": job.params.top_p,
            "truncation": req.truncation or "disabled",
            "usage": None if state is None else self._usage(job, state),
            "user": req.user,
        }

    # ---- streaming -----------------------------------------------------------------------

    async def _stream(self, req: ResponsesRequest, job: ChatJob, conversation: list[dict]):
        with self.chat.admitted(job) as ticket:
            events = _EventWriter()
            yield events.emit("response.created", response=self._body(req, job, [], None, None))
            yield events.emit("response.in_progress", response=self._body(req, job, [], None, None))
            items = _Items(events)
            final = reason = None
            async with aclosing(self.chat.deltas(job, ticket)) as deltas:
                async for d in deltas:
                    final = d.state
                    for piece in items.feed(d.deltas, (d.logprobs or {}).get("content") or []):
                        yield piece
                    if d.finished:
                        reason = d.finish_reason
            raise_if_aborted(reason)
            for piece in items.close():
                yield piece
            body = self._body(req, job, items.done, final, reason)
            self._remember(req, body, conversation)
            kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
            yield events.emit(kind, response=body)


class _EventWriter:
    def __init__(self) -> None:
        self.sequence = 0

    def emit(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, body)


class _Items:
    """The output items of a streamed response as they open, grow and close."""

    def __init__(self, events: _EventWriter) -> None:
        self.events = events
        self.done: list[dict] = []  # finished items, in output order
        self.open: dict | None = None  # the item being streamed
        self.pending_lps: list[dict] = []  # logprobs not sent yet

    @property
    def index(self) -> int:
        return len(self.done)

    def feed(self, deltas: list[dict], logprobs: list[dict]):
        """One step's chat deltas. Logprobs are the output text's: they ride on the next
        text delta (an empty one if the text is held back inside an open message); a tool
        call's tokens have none in this API, so a call that opens drops them."""
        self.pending_lps += logprobs
        for delta in deltas:
            if delta.get("reasoning_content"):
                yield from self.thinking(delta["reasoning_content"])
            if "content" in delta:
                yield from self.text(delta["content"], self.pending_lps)
                self.pending_lps = []
            for call in delta.get("tool_calls", []):
                self.pending_lps = []
                yield from self.call(call)
        if self.pending_lps and self.open is not None and self.open["type"] == "message":
            yield from self.text("", self.pending_lps)
            self.pending_lps = []

    def _open(self, item: dict, part: dict | None = None):
        """Start streaming `item`, closing the one before: its added event (and its one
        content part's, for a message or reasoning item)."""
        yield from self.close()
        self.open = item
        added = {**item, "content": []} if part is not None else dict(item)
        yield self.events.emit("response.output_item.added", output_index=self.index, item=added)
        if part is not None:
            yield self.events.emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.index,
                content_index=0,
                part=part,
            )

    def thinking(self, text: str):
        if self.open is None or self.open["type"] != "reasoning":
            item = _reasoning_item(_item_id("rs"), "", "in_progress")
            yield from self._open(item, {"type": "reasoning_text", "text": ""})
        self.open["content"][0]["text"] += text
        yield self.events.emit(
            "response.reasoning_text.delta",
            item_id=self.open["id"],
            output_index=self.index,
            content_index=0,
            delta=text,
        )

    def text(self, text: str, logprobs: list[dict]):
        if self.open is not None and self.open["type"] != "message":
            yield from self.close()
        if self.open is None:
            if not text and not logprobs:
                return
            item = _message_item(_item_id("msg"), "", [], "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield from self._open(item, part)
        part = self.open["content"][0]
        part["text"] += text
        part["logprobs"] += logprobs
        yield self.events.emit(
            "response.output_text.delta",
            item_id=self.open["id"],
            output_index=self.index,
            content_index=0,
            delta=text,
            logprobs=logprobs,
        )

    def call(self, delta: dict):
        """A chat tool_calls delta: a new call carries its id and name, later ones more
        arguments."""
        fn = delta.get("function", {})
        if "id" in delta:
            yield from self._open(_call_item(delta["id"], fn.get("name", ""), "", "in_progress"))
        args = fn.get("arguments") or ""
        if args and self.open is not None and self.open["type"] == "function_call":
            self.open["arguments"] += args
            yield self.events.emit(
                "response.function_call_arguments.delta",
                item_id=self.open["id"],
                output_index=self.index,
                delta=args,
            )

    def close(self):
        item, self.open = self.open, None
        if item is None:
            return
        emit = self.events.emit
        at = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "message":
            part = item["content"][0]
            done = {"text": part["text"], "logprobs": part["logprobs"]}
            yield emit("response.output_text.done", **at, content_index=0, **done)
            yield emit("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "reasoning":
            part = item["content"][0]
            yield emit("response.reasoning_text.done", **at, content_index=0, text=part["text"])
            yield emit("response.content_part.done", **at, content_index=0, part=part)
        else:
            done = {"name": item["name"], "arguments": item["arguments"]}
            yield emit("response.function_call_arguments.done", **at, **done)
        item["status"] = "completed"
        yield emit("response.output_item.done", output_index=self.index, item=item)
        self.done.append(item)


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "reasoning_text", "text": text}
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [part], "status": status}


def _message_item(item_id: str, text: str, logprobs: list[dict], status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "id": _item_id("fc"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump(exclude_none=True)
