"""Reasoning parsers (`--reasoning-parser NAME`): a model's thinking apart from its answer.

    parser = make_reasoning_parser("qwen3")()    one per sample
    thinking, answer = parser.feed(new_text)     as text streams (partial tags held back)
    thinking, answer = parser.finish()           at the end
    thinking, answer = split_reasoning(parser, whole_text)

One file per format: `think_tags.py` (DeepSeek-R1, Qwen3: <think> ... </think>), and
`harmony.py` (GPT-OSS: the analysis channel, then the final one). The chat path puts the
thinking into `reasoning_content` (and `reasoning`), the Responses API into a reasoning
item, the Messages API into a thinking block; tool calls and the answer are parsed from
what follows the thinking.
"""

from __future__ import annotations

from collections.abc import Callable

from cadence.entrypoints.reasoning.base import ReasoningParser, split_reasoning
from cadence.entrypoints.reasoning.harmony import HarmonyReasoningParser
from cadence.entrypoints.reasoning.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "gpt_oss": HarmonyReasoningParser,
}


def make_reasoning_parser(name: str) -> Callable[[], ReasoningParser]:
    """The parser class for `name` (ValueError naming the known ones)."""
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}"
        )
    return REASONING_PARSERS[name]


__all__ = ["REASONING_PARSERS", "ReasoningParser", "make_reasoning_parser", "split_reasoning"]
