"""DeepSeek-V3 / R1 (name after the separator, arguments in a json fence) and V3.1 (name
before it, bare arguments)."""

import pytest
from tool_parser_check import check, check_streams_incrementally

from cadence.entrypoints.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser

V3 = (
    "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
    "<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
V31 = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
    "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>"
)
CASES = {
    "V3: content then two calls": (
        V3,
        "Let me look.",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    "V3.1: two calls": (V31, "", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    "text after the calls": (
        V31 + " Done.",
        "Done.",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    "garbage after the begin marker is text": (
        "<｜tool▁calls▁begin｜>garbage here",
        "<｜tool▁calls▁begin｜>garbage here",
        [],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_deepseek_v3(case):
    check(DeepSeekV3ToolParser, *CASES[case])


def test_deepseek_streams_arguments_as_they_come():
    check_streams_incrementally(DeepSeekV3ToolParser, V3)
    check_streams_incrementally(DeepSeekV3ToolParser, V31.replace("{}", '{"a": "bc"}'))
