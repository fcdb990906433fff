"""What the engine is told about a reasoning model's thinking (thinking_bounds), with
SmolLM2's tokenizer: its tags are text, several tokens each."""

from __future__ import annotations

import pytest

from cadence.entrypoints.reasoning.harmony import HarmonyReasoningParser
from cadence.entrypoints.reasoning.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from cadence.entrypoints.thinking_bounds import thinking_bounds
from cadence.loader.model_path import resolve_model_path
from cadence.sampling_params import StructuredOutputsParams as S

SCHEMA = S(json={"type": "object"})


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(None))


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_a_prompt_inside_the_thinking_gets_its_end_marker(tok):
    prompt = ids(tok, "<|im_start|>assistant\n<think>\n")
    bounded = thinking_bounds(DeepSeekR1ReasoningParser, tok, prompt, SCHEMA, 64)
    assert bounded.json == SCHEMA.json and bounded.thinking_end == ids(tok, "</think>")
    assert bounded.thinking_start is None and bounded.max_thinking_tokens == 64
    assert SCHEMA.thinking_end is None  # the request's own constraint is not changed


def test_a_budget_alone_is_a_free_answer_after_the_thinking(tok):
    bounded = thinking_bounds(DeepSeekR1ReasoningParser, tok, ids(tok, "hi"), None, 8)
    assert bounded.kind == "free" and bounded.max_thinking_tokens == 8


def test_a_template_that_closed_the_thinking_leaves_the_constraint_as_is(tok):
    prompt = ids(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert thinking_bounds(DeepSeekR1ReasoningParser, tok, prompt, SCHEMA, None) is SCHEMA


def test_an_opener_spelled_as_text_cannot_be_bounded(tok):
    prompt = ids(tok, "<|im_start|>assistant\n")
    assert thinking_bounds(Qwen3ReasoningParser, tok, prompt, SCHEMA, None) is SCHEMA
    with pytest.raises(ValueError, match="max_thinking_tokens"):
        thinking_bounds(Qwen3ReasoningParser, tok, prompt, SCHEMA, 16)


def test_without_markers_a_budget_is_refused(tok):
    assert thinking_bounds(None, tok, [1], SCHEMA, None) is SCHEMA
    with pytest.raises(ValueError, match="--reasoning-parser"):
        thinking_bounds(None, tok, [1], None, 16)
    harmony = thinking_bounds(HarmonyReasoningParser, tok, [1], SCHEMA, None)
    assert harmony.thinking_end == ids(tok, "<|channel|>final<|message|>")
