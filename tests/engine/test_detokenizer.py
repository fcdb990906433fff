"""Incremental detokenization with the real SmolLM2 tokenizer (byte-level: an emoji is three
tokens): the text is the same whether tokens come one at a time or several per step (as
speculation brings them), nothing is lost at a step that ends inside a character, and at
the end the text equals a whole decode."""

from __future__ import annotations

import pytest

from cadence.engine.output_processor import IncrementalDetokenizer
from cadence.loader.model_path import resolve_model_path
from cadence.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path(None))


TEXTS = ["Hello 🌍🌍🌍 and 日本語 too — ok", "🌍" * 7, "plain words only"]


def stream(tokenizer, ids: list[int], chunk: int) -> tuple[str, list[str]]:
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3], skip_special_tokens=True)
    pieces = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return "".join(pieces) + detok.flush(), pieces


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5])
def test_steps_of_any_size_give_the_whole_decode(tokenizer, text, chunk):
    ids = tokenizer.encode(text, add_special_tokens=False)
    got, pieces = stream(tokenizer, ids, chunk)
    assert got == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_text_is_not_held_back_past_the_character_it_waits_for(tokenizer):
    ids = tokenizer.encode("🌍" * 7, add_special_tokens=False)
    assert len(ids) == 21  # three byte tokens each
    _, pieces = stream(tokenizer, ids, chunk=4)
    # Each step of 4 tokens completes at least one emoji: every step emits something.
    assert all(pieces)


def test_a_character_cut_at_the_end_reads_as_a_replacement(tokenizer):
    ids = tokenizer.encode("ok 🌍", add_special_tokens=False)[:-1]  # the last byte missing
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    shown = detok.push(ids)
    assert "\ufffd" not in shown
    assert shown + detok.flush() == tokenizer.decode(ids, skip_special_tokens=True)
