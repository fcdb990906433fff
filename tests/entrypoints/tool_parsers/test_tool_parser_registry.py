"""--tool-call-parser names, and `auto` reading the chat template."""

import pytest

from cadence.entrypoints.tool_parsers import TOOL_PARSERS, detect_tool_parser, tool_parser_factory
from cadence.entrypoints.tool_parsers.hermes import HermesToolParser

TEMPLATES = {
    "qwen3_coder": "{{ '<tool_call>\\n<function=' + name + '>' }}<parameter={{ k }}>",
    "hermes": "{% if tools %}<tools>{{ tools }}</tools> answer in <tool_call></tool_call>{% endif %}",
    "mistral": "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]",
    "deepseek_v3": "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] }}",
    "openai": "{{- '<|start|>assistant to=' + recipient + '<|channel|>commentary json<|message|>' }}<|call|>",
    "llama3_json": "{%- if tools %}<|python_tag|>{{ tool_call | tojson }}{% endif %}",
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_auto_reads_the_template(name):
    assert detect_tool_parser(TEMPLATES[name]) == name
    assert tool_parser_factory("auto", TEMPLATES[name]) is TOOL_PARSERS[name]


def test_a_template_naming_no_format_is_hermes():
    assert tool_parser_factory("auto", "{{ messages }}") is HermesToolParser
    assert tool_parser_factory("auto", None) is HermesToolParser


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: auto, deepseek_v3, hermes"):
        tool_parser_factory("pythonic")
