"""Tool-call parsers (`--tool-call-parser NAME`): the calls in a model's answer, in its format.

    factory = tool_parser_factory("auto", chat_template)   once, at start
    parser = factory(parameters)              one per sample (each tool's schema by name)
    pieces = parser.feed(new_text)            content (str) or ToolCallDelta, as text streams
    pieces = parser.finish()                  at the end
    content, calls = parse_tool_calls(factory(parameters, incremental=False), whole_text)

One file per format: `hermes.py` (Hermes, Qwen 2.5 / 3), `llama3_json.py` (Llama 3.x),
`mistral.py`, `qwen3_coder.py` (XML), `deepseek_v3.py` (V3, R1, V3.1), `harmony.py`
(GPT-OSS, `openai`). `auto` reads the chat template for the format's markers; a template
that does not know tools gets Hermes instructions from cadence, so Hermes it is.
"""

from __future__ import annotations

from collections.abc import Callable

from cadence.entrypoints.tool_parsers.base import (
    ToolCall,
    ToolCallDelta,
    ToolParser,
    collect,
    new_call_id,
    parse_tool_calls,
)
from cadence.entrypoints.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser
from cadence.entrypoints.tool_parsers.harmony import HarmonyToolParser
from cadence.entrypoints.tool_parsers.hermes import HermesToolParser
from cadence.entrypoints.tool_parsers.llama3_json import Llama3JsonToolParser
from cadence.entrypoints.tool_parsers.mistral import MistralToolParser
from cadence.entrypoints.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "openai": HarmonyToolParser,
}

# What a chat template writes for each format, most specific first.
_TEMPLATE_MARKERS: list[tuple[str, tuple[str, ...]]] = [
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("hermes", ("<tool_call>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("deepseek_v3", ("tool▁calls▁begin",)),
    ("openai", ("<|call|>",)),
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ("ipython", '"parameters"')),
]


def detect_tool_parser(chat_template: str | None) -> str:
    """The format a chat template teaches its model (Hermes when it names none)."""
    template = chat_template or ""
    for name, markers in _TEMPLATE_MARKERS:
        if all(m in template for m in markers):
            return name
    return "hermes"


def tool_parser_factory(name: str, chat_template: str | None = None) -> type[ToolParser]:
    """The parser class for `name` ("auto": from the chat template). ValueError names the
    known ones."""
    if name == "auto":
        name = detect_tool_parser(chat_template)
    if name not in TOOL_PARSERS:
        known = ", ".join(["auto", *sorted(TOOL_PARSERS)])
        raise ValueError(f"unknown tool-call parser {name!r}; known: {known}")
    return TOOL_PARSERS[name]


ToolParserFactory = Callable[..., ToolParser]

__all__ = [
    "TOOL_PARSERS",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "ToolParserFactory",
    "collect",
    "detect_tool_parser",
    "new_call_id",
    "parse_tool_calls",
    "tool_parser_factory",
]
