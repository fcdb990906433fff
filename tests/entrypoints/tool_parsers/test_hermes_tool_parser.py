"""Hermes / Qwen <tool_call> blocks."""

import pytest
from tool_parser_check import check, check_streams_incrementally

from cadence.entrypoints.tool_parsers.hermes import HermesToolParser

CASES = {
    "content then a call": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call>",
        "Let me check.",
        [("get_weather", {"city": "Paris"})],
    ),
    "two calls, one with empty arguments": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Rome", "days": 3}), ("get_time", {})],
    ),
    "braces, quotes and unicode inside strings": (
        '<tool_call>{"name": "note", "arguments": {"text": "a } b { \\"q\\" ü 日本", '
        '"tags": ["x", {"y": [1, 2]}]}}</tool_call>',
        "",
        [("note", {"text": 'a } b { "q" ü 日本', "tags": ["x", {"y": [1, 2]}]})],
    ),
    "arguments as JSON text, keys in another order": (
        '<tool_call>{"arguments": "{\\"x\\": 1}", "name": "a"}</tool_call>',
        "",
        [("a", {"x": 1})],
    ),
    "malformed block stays text": (
        "Answer <tool_call>not json</tool_call> done",
        "Answer <tool_call>not json</tool_call> done",
        [],
    ),
    "stray text after the call's object is dropped": (
        '<tool_call>{"name": "f", "arguments": {}}}\n</tool_call>',
        "",
        [("f", {})],
    ),
    "unclosed last block (cut short) that parses": (
        'x <tool_call>bad</tool_call> <tool_call>{"name": "f", "arguments": {"a": 1}}',
        "x <tool_call>bad</tool_call>",
        [("f", {"a": 1})],
    ),
    "a partial tag at the end is text": ("Done <tool_", "Done <tool_", []),
    "plain answer": ("It is sunny <b>today</b>.", "It is sunny <b>today</b>.", []),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_hermes(case):
    check(HermesToolParser, *CASES[case])


def test_hermes_streams_arguments_as_they_come():
    check_streams_incrementally(HermesToolParser, CASES["two calls, one with empty arguments"][0])


def test_hermes_holds_back_only_what_may_be_a_tag():
    parser = HermesToolParser()
    assert parser.feed("a <tool") == ["a "]
    assert parser.feed("box>") == ["<toolbox>"]
