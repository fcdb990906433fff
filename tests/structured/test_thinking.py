"""A grammar after the thinking (structured/thinking.py), with SmolLM2's vocabulary: free
while thinking, the grammar after the end marker, a budget that writes the marker by
force, a model that skips thinking, and rollback across the phase change."""

from __future__ import annotations

import time

import pytest

from cadence.loader.model_path import resolve_model_path
from cadence.sampling_params import StructuredOutputsParams as S
from cadence.structured.manager import GrammarManager

VOCAB = 49152
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def setup():
    from transformers import AutoTokenizer

    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(path)
    manager = GrammarManager(path, VOCAB, (2,))
    yield tok, manager
    manager.shutdown()


def ready(manager: GrammarManager, rid: str, params: S):
    manager.submit(rid, params)
    deadline = time.monotonic() + 60
    while rid not in manager.matchers:
        _, failed = manager.poll(timeout=0.05)
        assert not failed and time.monotonic() < deadline
    return manager.matchers[rid]


def allowed(mask, row: int) -> list[int]:
    words = mask[row]
    return [t for t in range(VOCAB) if (int(words[t // 32]) >> (t % 32)) & 1]


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_free_while_thinking_then_the_grammar(setup):
    tok, manager = setup
    end = ids(tok, "</think>")
    matcher = ready(manager, "a", S(json=ANSWER, thinking_end=end))
    for t in ids(tok, "I wonder. {not json"):
        assert (manager.fill_bitmask(["a"])[0] == -1).all()
        assert matcher.accept_token(t)
    for t in end:
        matcher.accept_token(t)
    after = allowed(manager.fill_bitmask(["a"]), 0)
    assert tok.convert_tokens_to_ids("{") in after and len(after) < 50
    assert not matcher.accept_token(ids(tok, "Hello")[0])  # the answer is the grammar's


def test_budget_forces_the_end_marker(setup):
    tok, manager = setup
    end = ids(tok, "</think>")
    matcher = ready(manager, "b", S(json=ANSWER, thinking_end=end, max_thinking_tokens=2))
    for t in ids(tok, "Long thoughts")[:2]:
        matcher.accept_token(t)
    assert allowed(manager.fill_bitmask(["b"]), 0) == [end[0]]
    done, forced = manager.advance("b", end[0], jump_forward=True)
    assert not done and tok.decode([end[0], *forced]) == "</think>"  # the rest, at once
    assert matcher.phase == "grammar"


def test_a_model_that_does_not_open_thinking_is_constrained_from_its_first_token(setup):
    tok, manager = setup
    start, end = ids(tok, "<|im_start|>"), ids(tok, "</think>")  # (any one token as the opener)
    matcher = ready(manager, "c", S(json=ANSWER, thinking_end=end, thinking_start=start[0]))
    first = allowed(manager.fill_bitmask(["c"]), 0)
    assert start[0] in first and tok.convert_tokens_to_ids("{") in first and len(first) < 50
    assert matcher.accept_token(tok.convert_tokens_to_ids("{"))
    assert matcher.phase == "grammar"
    matcher.rollback(1)  # back before the first token: thinking may open again
    assert matcher.phase == "start" and matcher.accept_token(start[0])
    assert (manager.fill_bitmask(["c"])[0] == -1).all()


def test_rollback_across_the_end_of_thinking(setup):
    tok, manager = setup
    end = ids(tok, "</think>")
    matcher = ready(manager, "d", S(json=ANSWER, thinking_end=end))
    brace = tok.convert_tokens_to_ids("{")
    for t in [*ids(tok, "hm"), *end, brace]:
        assert matcher.accept_token(t)
    matcher.rollback(2)  # the brace and the marker's last token
    assert matcher.phase == "thinking" and matcher.matched == len(end) - 1
    assert (manager.fill_bitmask(["d"])[0] == -1).all()
    assert matcher.accept_token(end[-1]) and matcher.accept_token(brace)


def test_free_answer_with_a_budget_only(setup):
    tok, manager = setup
    end = ids(tok, "</think>")
    matcher = ready(manager, "e", S(thinking_end=end, max_thinking_tokens=0))
    assert allowed(manager.fill_bitmask(["e"]), 0) == [end[0]]
    for t in end:
        matcher.accept_token(t)
    assert (manager.fill_bitmask(["e"])[0] == -1).all() and not matcher.is_terminated()
