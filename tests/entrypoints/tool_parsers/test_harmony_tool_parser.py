"""GPT-OSS harmony: a call is a message to `functions.NAME`; with the gpt_oss reasoning
parser in front, the analysis channel is thinking and calls reach this parser whole."""

import pytest
from tool_parser_check import check, check_streams_incrementally

from cadence.entrypoints.reasoning import make_reasoning_parser, split_reasoning
from cadence.entrypoints.tool_parsers import parse_tool_calls
from cadence.entrypoints.tool_parsers.harmony import HarmonyToolParser

RAW = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
CASES = {
    "analysis, then a call (no reasoning parser: analysis is content)": (
        RAW,
        "Need the weather.",
        [("get_weather", {"city": "Paris"})],
    ),
    "recipient before the channel, empty arguments": (
        "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>",
        "",
        [("get_time", {})],
    ),
    "a final answer": ("<|channel|>final<|message|>It is sunny.", "It is sunny.", []),
    "arguments that do not parse are text": (
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
        "not json<|call|>",
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
        "not json<|call|>",
        [],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_harmony(case):
    check(HarmonyToolParser, *CASES[case])


def test_harmony_streams_arguments_as_they_come():
    check_streams_incrementally(HarmonyToolParser, RAW)


def test_after_the_reasoning_parser_the_call_is_intact():
    thinking, answer = split_reasoning(make_reasoning_parser("gpt_oss")(), RAW)
    assert thinking == "Need the weather."
    content, calls = parse_tool_calls(HarmonyToolParser(incremental=False), answer)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]
