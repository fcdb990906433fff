"""Tokenizing prompt text within bounds (entrypoints/tokenizing.py), with a tokenizer that
counts its calls: a text that cannot fit is refused without a call; a long one is counted
chunk by chunk and stops as soon as it is over the context, or past its deadline (no
thread keeps working after the 408); the large lane takes only so many characters at once;
what fits comes back exactly as the tokenizer's own ids."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cadence.entrypoints.errors import APIError
from cadence.entrypoints.tokenizing import CHUNK_CHARS, SMALL_CHARS, TokenizerLanes, chunks


class WordTokenizer:
    """A token per white-space-separated word; `delay` seconds per call."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0
        self.lock = threading.Lock()

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "abcdefgh": 1}  # the longest token: 8 characters

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        return [1] * len(text.split()) + ([0] if add_special_tokens else [])


def lanes(tok, max_model_len: int = 100_000, timeout_s: float = 10.0, **kw) -> TokenizerLanes:
    return TokenizerLanes(tok, max_model_len, timeout_s, ThreadPoolExecutor(2), **kw)


def test_chunks_cut_at_white_space_and_lose_nothing():
    text = ("word " * 40_000) + "x" * 100_000
    pieces = list(chunks(text))
    assert "".join(pieces) == text
    assert all(len(p) <= CHUNK_CHARS for p in pieces)
    assert pieces[0].endswith("word") and pieces[1].startswith(" word")


def test_a_text_that_cannot_fit_costs_no_tokenizing():
    tok = WordTokenizer()
    with pytest.raises(APIError) as e:
        asyncio.run(lanes(tok, max_model_len=10).encode("x" * 81, True))  # > 10 x 8 characters
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    assert tok.calls == 0


def test_a_long_text_over_the_context_stops_at_the_first_chunk_that_shows_it():
    tok = WordTokenizer()
    text = "w " * (5 * CHUNK_CHARS // 2)  # 5 chunks, 32,768 words each
    with pytest.raises(APIError) as e:
        asyncio.run(lanes(tok, max_model_len=45_000).encode(text, True))
    assert e.value.code == "context_length_exceeded"
    assert tok.calls == 2  # 32,768 then 65,536 words: over 45,000 after the second chunk


def test_what_fits_comes_back_exact():
    tok = WordTokenizer()
    small = "w " * 10
    assert asyncio.run(lanes(tok).encode(small, True)) == tok.encode(small, True)
    text = "w " * (3 * CHUNK_CHARS // 2)  # 98,304 words: under 100,000
    assert len(text) > SMALL_CHARS
    assert asyncio.run(lanes(tok).encode(text, False)) == tok.encode(text, False)


def test_past_the_deadline_the_large_lane_stops_between_chunks():
    tok = WordTokenizer(delay=0.2)
    text = "w " * (20 * CHUNK_CHARS // 2)  # 20 chunks x 0.2 s: far past a 0.5 s deadline
    started = time.monotonic()
    with pytest.raises(APIError) as e:
        asyncio.run(lanes(tok, max_model_len=10**6, timeout_s=0.5).encode(text, True))
    assert e.value.status == 408
    time.sleep(0.5)  # (the lane's current chunk ends, and it stops there)
    calls = tok.calls
    time.sleep(0.5)
    assert tok.calls == calls <= 5, "the lane kept tokenizing after the 408"
    assert time.monotonic() - started < 5


def test_the_large_lane_takes_only_so_many_characters():
    tok = WordTokenizer(delay=0.3)
    text = "w " * CHUNK_CHARS  # 131,072 characters: the large lane
    lane = lanes(tok, large_budget_chars=3 * len(text))

    async def many():
        return await asyncio.gather(
            *(lane.encode(text, True) for _ in range(5)), return_exceptions=True
        )

    results = asyncio.run(many())
    busy = [r for r in results if isinstance(r, APIError)]
    assert len(busy) == 2 and all(r.status == 429 and r.code == "tokenizer_busy" for r in busy)
    assert sum(isinstance(r, list) for r in results) == 3
