"""Reasoning parsers on recorded outputs in each family's format, whole and streamed a
character at a time (every split point a tokenizer could make): the thinking and the
answer come out the same either way, and markers never leak into either."""

from __future__ import annotations

import pytest

from cadence.entrypoints.reasoning import make_reasoning_parser, split_reasoning

CASES = [
    # (parser, model output, thinking, answer)
    ("qwen3", "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.", "\nThe user wants 2+2.\n", "It is 4."),
    ("qwen3", "It is 4.", "", "It is 4."),  # enable_thinking false: no block
    ("qwen3", "  <think>hm</think>ok", "hm", "ok"),
    ("qwen3", "<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("qwen3", "a < b, and <think> is only a word here", "", "a < b, and <think> is only a word here"),
    ("deepseek_r1", "Let me think.\n</think>\n\nThe answer is 4.", "Let me think.\n", "The answer is 4."),
    ("deepseek_r1", "<think>Hmm.</think>Yes.", "Hmm.", "Yes."),
    ("deepseek_r1", "still thinking", "still thinking", ""),
    ("gpt_oss", "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>", "User asks 2+2.", "4"),
    ("gpt_oss", "<|channel|>final<|message|>Just the answer.<|return|>", "", "Just the answer."),
    ("gpt_oss", "<|channel|>analysis<|message|>no answer yet", "no answer yet", ""),
]  # fmt: skip


@pytest.mark.parametrize("name, text, thinking, answer", CASES)
def test_whole_and_streamed_agree(name, text, thinking, answer):
    make = make_reasoning_parser(name)
    assert split_reasoning(make(), text) == (thinking, answer)
    parser, got_t, got_a = make(), "", ""
    for ch in text:
        t, a = parser.feed(ch)
        got_t, got_a = got_t + t, got_a + a
    t, a = parser.finish()
    assert (got_t + t, got_a + a) == (thinking, answer)


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="deepseek_r1, gpt_oss, qwen3"):
        make_reasoning_parser("nope")
