"""Llama 3.x JSON calls: at the answer's start or after <|python_tag|>, `;`-separated."""

import pytest
from tool_parser_check import check, check_streams_incrementally

from cadence.entrypoints.tool_parsers.llama3_json import Llama3JsonToolParser

CASES = {
    "python tag, two calls": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    "a bare call object": (
        '{"name": "search", "parameters": {"q": "llama {3}", "n": [1, 2]}}',
        "",
        [("search", {"q": "llama {3}", "n": [1, 2]})],
    ),
    "content, then the python tag": (
        'Let me look. <|python_tag|>{"name": "f", "parameters": {"a": 1}}',
        "Let me look.",
        [("f", {"a": 1})],
    ),
    "JSON that is no call is content": (
        '{"answer": 42} is the answer',
        '{"answer": 42} is the answer',
        [],
    ),
    "text is content": ("Hello! How can I help?", "Hello! How can I help?", []),
    "text after the calls is content": (
        '{"name": "f", "parameters": {}} and that is all',
        "and that is all",
        [("f", {})],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_llama3_json(case):
    check(Llama3JsonToolParser, *CASES[case])


def test_llama3_json_streams_arguments_as_they_come():
    check_streams_incrementally(Llama3JsonToolParser, CASES["a bare call object"][0])
