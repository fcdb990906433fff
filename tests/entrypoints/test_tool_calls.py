"""Tool calling without a model: plans, prompts for templates without tool support, and
answers shaped into OpenAI's message / deltas per tool_choice (the formats themselves:
tests/entrypoints/tool_parsers)."""

from __future__ import annotations

import json

import pytest

from cadence.entrypoints.tool_calls import (
    ChatTool,
    NamedToolChoice,
    ToolCallStream,
    message_from_output,
    parse_required,
    plan_tools,
    render_without_template_support,
)
from cadence.entrypoints.tool_parsers.llama3_json import Llama3JsonToolParser
from cadence.entrypoints.tool_parsers.mistral import MistralToolParser
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


NAMED = NamedToolChoice.model_validate({"function": {"name": "get_weather"}})
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def test_forced_calls_in_a_special_token_format_are_a_json_array():
    required = plan_tools([WEATHER, TIME], "required", False, MistralToolParser).constraint()
    assert required.json["maxItems"] == 1
    to_grammar(required)
    named = plan_tools([WEATHER], NAMED, parser=MistralToolParser)
    assert named.constraint().json == WEATHER.function.parameters
    assert plan_tools([WEATHER], "auto").constraint() is None


def test_forced_calls_in_a_text_format_are_written_in_it():
    def accepts(plan, text):
        import xgrammar as xgr

        compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(
            to_grammar(plan.constraint())
        )
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return matcher.accept_string(text) and matcher.is_terminated()

    required = plan_tools([WEATHER, TIME], "required")
    time_call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert required.forced_in_format
    assert accepts(required, HERMES_CALL) and accepts(required, f"{HERMES_CALL}\n{time_call}")
    assert not accepts(required, "Sure!") and not accepts(required, '[{"name": "get_time"}]')
    one = plan_tools([WEATHER, TIME], "required", parallel=False)
    assert not accepts(one, f"{HERMES_CALL}\n{time_call}")
    named = plan_tools([WEATHER, TIME], NAMED)
    assert accepts(named, HERMES_CALL) and not accepts(named, time_call)
    assert not accepts(named, HERMES_CALL.replace('"Oslo"', "1"))  # its arguments' schema
    llama = plan_tools([WEATHER], NAMED, parser=Llama3JsonToolParser)
    assert accepts(llama, '{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    # Arguments a grammar cannot wholly enforce: the JSON form, whose values are checked.
    unique = ChatTool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "tag",
                "parameters": {"type": "object", "properties": {"t": {"uniqueItems": True}}},
            },
        }
    )
    assert not plan_tools([unique], "required").forced_in_format


def test_forced_calls_in_the_format_are_read_by_its_parser():
    named = plan_tools([WEATHER], NAMED)
    msg, calls = message_from_output(named, HERMES_CALL)
    assert msg["content"] is None and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Oslo"}')
    ]
    stream = ToolCallStream(plan_tools([WEATHER, TIME], "required"))
    deltas = [d for ch in HERMES_CALL for d in stream.feed(ch)] + stream.finish()
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "get_weather" and len(deltas) > 2
    assert [json.loads(c.arguments) for c in stream.calls] == [{"city": "Oslo"}]


def test_parse_required_array():
    calls = parse_required(
        '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    )
    assert [c.name for c in calls] == ["get_time", "get_weather"]
    assert parse_required("[{") == []
    assert parse_required("not an array") == []


def test_required_stream_sends_each_call_as_it_is_written():
    stream = ToolCallStream(plan_tools([WEATHER, TIME], "required", parser=MistralToolParser))
    text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
    heads = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [
        (0, "get_weather"),
        (1, "get_time"),
    ]
    assert len(deltas) > 3  # the arguments came in pieces
    assert [json.loads(c.arguments) for c in stream.calls] == [{"city": "Oslo"}, {}]


def test_the_parser_reads_auto_answers_in_the_model_format():
    plan = plan_tools([WEATHER], "auto", parser=MistralToolParser)
    msg, calls = message_from_output(plan, 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}')
    assert msg["content"] == "Sure." and calls[0].name == "get_weather" and len(calls[0].id) == 9


def test_named_stream_sends_id_and_name_first_then_argument_pieces():
    plan = plan_tools([WEATHER], NAMED, parser=MistralToolParser)  # (the JSON form)
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
    assert {d["tool_calls"][0]["index"] for d in deltas} == {0}
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "get_time"


def test_a_forced_call_cut_short_is_still_the_call():
    named = plan_tools([WEATHER], NAMED)
    cut = HERMES_CALL[:60]  # max_tokens ended it inside the arguments
    msg, calls = message_from_output(named, cut)
    assert msg["content"] is None and calls[0].arguments == '{"city": "O'
    stream = ToolCallStream(named)
    deltas = [d for ch in cut for d in stream.feed(ch)] + stream.finish()
    assert all("content" not in d for d in deltas)
    assert [(c.name, c.arguments) for c in stream.calls] == [("get_weather", '{"city": "O')]
