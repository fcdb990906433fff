"""Qwen3-Coder's XML calls, values typed by the tool's schema."""

import pytest
from tool_parser_check import check

from cadence.entrypoints.tool_parsers import ToolCallDelta
from cadence.entrypoints.tool_parsers.qwen3_coder import Qwen3CoderToolParser

PARAMETERS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "hourly": {"type": "boolean"},
            "where": {"type": "object"},
        },
    }
}
CASES = {
    "content, a typed call, an empty one": (
        'I\'ll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, "FR"\n'
        "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=hourly>\nTrue\n"
        '</parameter>\n<parameter=where>\n{"lat": 1.5}\n</parameter>\n</function>\n'
        "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "I'll check.",
        [
            (
                "get_weather",
                {"city": 'Paris, "FR"', "days": 3, "hourly": True, "where": {"lat": 1.5}},
            ),
            ("get_time", {}),
        ],
    ),
    "a string that looks like a number stays a string": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n"
        "</tool_call>",
        "",
        [("get_weather", {"city": "42"})],
    ),
    "multi-line text value": (
        "<tool_call>\n<function=write>\n<parameter=body>\nline 1\n  line 2 </x>\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        [("write", {"body": "line 1\n  line 2 </x>"})],
    ),
    "a block with no function stays text": (
        "<tool_call>\njust text\n</tool_call> done",
        "<tool_call>\njust text\n</tool_call> done",
        [],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_qwen3_coder(case):
    check(Qwen3CoderToolParser, *CASES[case], parameters=PARAMETERS)


def test_qwen3_coder_streams_one_parameter_at_a_time():
    parser = Qwen3CoderToolParser(PARAMETERS)
    text = CASES["content, a typed call, an empty one"][0]
    args = []
    for ch in text:
        args += [p.arguments for p in parser.feed(ch) if isinstance(p, ToolCallDelta)]
    assert args[:3] == ["{", '"city": "Paris, \\"FR\\""', ', "days": 3']
