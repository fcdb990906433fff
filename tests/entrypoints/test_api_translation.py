"""The Responses and Messages requests as the chat path's request, without a server: what
each API's conversation becomes, and the Responses store's bounds."""

from __future__ import annotations

import asyncio

import pytest

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.messages_protocol import MessagesRequest
from cadence.entrypoints.messages_protocol import to_chat as messages_to_chat
from cadence.entrypoints.responses_protocol import ResponsesRequest, input_messages
from cadence.entrypoints.responses_protocol import to_chat as responses_to_chat
from cadence.entrypoints.serving_responses import ResponsesServing, ResponseStore


def test_responses_items_become_chat_messages():
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]  # fmt: skip
    out = input_messages(items)
    assert [m["role"] for m in out] == ["developer", "user", "assistant", "tool", "tool"]
    assert out[1]["content"] == "ab"
    assert [c["id"] for c in out[2]["tool_calls"]] == ["c1", "c2"]  # two calls, one turn
    assert (out[3]["tool_call_id"], out[4]["content"]) == ("c1", "two")


def test_responses_fields_map_onto_chat():
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 7,
            "top_logprobs": 2,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
        }
    )  # fmt: skip
    chat = responses_to_chat(req, history=[{"role": "user", "content": "earlier"}])
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "be brief"), ("user", "earlier"), ("user", "hi")]  # fmt: skip
    assert chat.max_completion_tokens == 7 and chat.logprobs and chat.top_logprobs == 2
    assert chat.tool_choice.function.name == "f" and chat.parallel_tool_calls is False
    assert chat.response_format.json_schema.strict is True


def test_messages_blocks_become_chat_messages():
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "sys"}],
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "bad", "is_error": True}]},
            ],
        }
    )  # fmt: skip
    chat = messages_to_chat(req)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool"]  # no empty user turn after results
    call = chat.messages[2].tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("t1", "f", '{"a": 1}')
    assert chat.messages[3].text() == "Error: bad" and chat.messages[3].tool_call_id == "t1"
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.stop == ["END"] and chat.max_tokens == 5


def test_the_store_keeps_the_newest_and_refuses_malformed_ids():
    store = ResponseStore(2)
    ids = [f"resp_{i:032x}" for i in range(3)]
    for rid in ids:
        store.put({"id": rid}, [])
    with pytest.raises(APIError) as e:
        store.get(ids[0])  # the oldest went first
    assert e.value.status == 404
    assert store.get(ids[2])[0] == {"id": ids[2]}
    with pytest.raises(APIError):
        store.get("../" + ids[2])


def test_previous_response_id_without_a_store_is_a_clear_400():
    serving = ResponsesServing(chat=None, store=None)  # refused before the chat path runs
    req = ResponsesRequest.model_validate({"input": "hi", "previous_response_id": "resp_1"})
    with pytest.raises(APIError) as e:
        asyncio.run(serving.create(req))
    assert e.value.status == 400 and "--responses-store-size" in e.value.message
