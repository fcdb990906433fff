"""Tool calling without a model: plans, prompts for templates without tool support, and
parsing the Hermes `<tool_call>` format, whole and streamed."""

from __future__ import annotations

import json

import pytest

from cadence.entrypoints.tool_calls import (
    ChatTool,
    HermesStreamParser,
    NamedToolChoice,
    ToolCallStream,
    message_from_output,
    parse_hermes,
    parse_required,
    plan_tools,
    render_without_template_support,
)
from cadence.structured.grammar import to_grammar

WEATHER = ChatTool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
)
TIME = ChatTool.model_validate({"type": "function", "function": {"name": "get_time"}})


def test_plans():
    assert plan_tools(None, None).mode == "none"
    assert plan_tools([WEATHER], None).mode == "auto"
    assert plan_tools([WEATHER], "none").in_prompt is False
    named = plan_tools(
        [WEATHER, TIME], NamedToolChoice.model_validate({"function": {"name": "get_time"}})
    )
    assert (named.mode, named.function_name) == ("named", "get_time")
    with pytest.raises(ValueError, match="not in tools"):
        plan_tools([WEATHER], NamedToolChoice.model_validate({"function": {"name": "nope"}}))
    with pytest.raises(ValueError, match="at least one tool"):
        plan_tools(None, "required")
    with pytest.raises(ValueError, match="unique"):
        plan_tools([WEATHER, WEATHER], "auto")


def test_forced_calls_compile_to_grammars():
    required = plan_tools([WEATHER, TIME], "required", parallel=False).constraint()
    assert required.json["maxItems"] == 1
    to_grammar(required)
    named = plan_tools(
        [WEATHER], NamedToolChoice.model_validate({"function": {"name": "get_weather"}})
    )
    assert named.constraint().json == WEATHER.function.parameters
    assert plan_tools([WEATHER], "auto").constraint() is None


def test_parse_hermes_calls_and_content():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_hermes(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].id.startswith("call_")
    # Two calls; arguments given as a JSON string; an unclosed last block.
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {}}'
    )
    _, calls = parse_hermes(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    # Not a call: the text stays content.
    assert parse_hermes("<tool_call>not json</tool_call>") == (
        "<tool_call>not json</tool_call>",
        [],
    )
    assert parse_hermes("plain answer") == ("plain answer", [])
    # A bad block before an unclosed good one: the good one is still found (as streaming does).
    content, calls = parse_hermes(
        'x <tool_call>bad</tool_call> <tool_call>{"name": "f", "arguments": {}}'
    )
    assert [c.name for c in calls] == ["f"] and content == "x <tool_call>bad</tool_call>"


def test_parse_required_array():
    calls = parse_required(
        '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    )
    assert [c.name for c in calls] == ["get_time", "get_weather"]
    assert parse_required("[{") == []


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_stream_parser_gives_the_same_result_at_any_chunking(step):
    text = 'Sure <b>.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\nDone <tool_'
    parser = HermesStreamParser()
    content, calls = "", []
    for i in range(0, len(text), step):
        c, k = parser.feed(text[i : i + step])
        content += c
        calls += k
    c, k = parser.finish()
    content += c
    calls += k
    assert content == "Sure <b>.\n\nDone <tool_"
    assert [c.name for c in calls] == ["get_weather"]


def test_stream_holds_back_only_what_may_be_a_tag():
    parser = HermesStreamParser()
    assert parser.feed("a <tool") == ("a ", [])
    assert parser.feed("box>") == ("<toolbox>", [])


def test_named_stream_sends_id_and_name_first_then_argument_pieces():
    plan = plan_tools(
        [WEATHER], NamedToolChoice.model_validate({"function": {"name": "get_weather"}})
    )
    stream = ToolCallStream(plan)
    first = stream.feed('{"city"')
    second = stream.feed(': "Oslo"}')
    head = first[0]["tool_calls"][0]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": '{"city"'}
    assert second == [{"tool_calls": [{"index": 0, "function": {"arguments": ': "Oslo"}'}}]}]
    assert stream.finish() == []


def test_message_from_output():
    auto = plan_tools([WEATHER], "auto")
    msg, calls = message_from_output(
        auto, '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "get_weather"
    msg, calls = message_from_output(auto, "It is sunny.")
    assert msg == {"role": "assistant", "content": "It is sunny."} and calls == []


def test_conversation_for_templates_without_tool_support():
    messages = [
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
    ]
    out = render_without_template_support(messages, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert "<tools>" in out[0]["content"] and '"get_weather"' in out[0]["content"]
    assert (
        out[2]["content"]
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    assert out[3]["content"] == '<tool_response>\n{"temp": 21}\n</tool_response>'


def test_parallel_tool_calls_false_keeps_the_first_call():
    plan = plan_tools([WEATHER, TIME], "auto", parallel=False)
    text = (
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    _, calls = message_from_output(plan, text)
    assert [c.name for c in calls] == ["get_time"]
    stream = ToolCallStream(plan)
    deltas = stream.feed(text) + stream.finish()
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas] == ["get_time"]
