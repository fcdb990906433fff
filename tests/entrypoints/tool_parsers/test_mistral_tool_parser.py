"""Mistral's [TOOL_CALLS], in its JSON-array form and its v11 `name[ARGS]{...}` form."""

import re

import pytest
from tool_parser_check import check, check_streams_incrementally, stream

from cadence.entrypoints.tool_parsers import collect
from cadence.entrypoints.tool_parsers.mistral import MistralToolParser

CASES = {
    "array of two calls": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    "v11: content, then two calls": (
        'Checking. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": [1, 2]}'
        "[TOOL_CALLS]get_time[ARGS]{}",
        "Checking.",
        [("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {})],
    ),
    "v11 with a call id": (
        '[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Oslo"}',
        "",
        [("get_weather", {"city": "Oslo"})],
    ),
    "not calls: text": (
        "[TOOL_CALLS] I would rather not",
        "[TOOL_CALLS] I would rather not",
        [],
    ),
    "an array item that is no call: text": (
        '[TOOL_CALLS][{"nam": 1}] after',
        '[TOOL_CALLS][{"nam": 1}] after',
        [],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_mistral(case):
    check(MistralToolParser, *CASES[case])


def test_mistral_streams_arguments_and_uses_its_id_form():
    text = CASES["v11: content, then two calls"][0]
    check_streams_incrementally(MistralToolParser, text)
    _, calls = collect(stream(MistralToolParser(), text, 1))
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls)
