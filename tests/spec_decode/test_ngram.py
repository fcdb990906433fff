"""N-gram (prompt lookup) proposals: the longest suffix (within the configured range) that
occurred before wins; among its occurrences, the latest with k tokens after it, else the
one with the most; checked against a brute-force search on random sequences."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cadence.spec_decode.ngram import lookup


def brute_force(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        starts = [s for s in range(length - n) if tokens[s : s + n] == suffix]
        if not starts:
            continue
        full = [s for s in starts if length - (s + n) >= k]
        s = full[-1] if full else starts[0]
        return tokens[s + n : s + n + k]
    return []


def propose(tokens, k=3, n_min=1, n_max=4):
    return lookup(np.array(tokens, dtype=np.int64), k, n_min, n_max)


def test_copies_what_followed_the_suffix():
    assert propose([1, 2, 3, 4, 5, 6, 9, 2, 3]) == [4, 5, 6]


def test_the_longest_suffix_wins():
    # "3" alone was followed by 7, but "2 3" by 4.
    assert propose([3, 7, 0, 2, 3, 4, 5, 6, 1, 2, 3]) == [4, 5, 6]


def test_latest_match_with_k_tokens_after_it():
    assert propose([8, 1, 2, 8, 3, 4, 8, 5, 6, 0, 8], k=2, n_max=1) == [5, 6]
    # The latest occurrence has one token after it: an earlier one with k is taken.
    assert propose([8, 1, 2, 3, 0, 8, 4, 8], k=3, n_max=1) == [1, 2, 3]


def test_nothing_below_the_minimum_length():
    assert propose([5, 1, 9, 2, 1], n_min=2) == []
    assert propose([5, 1, 9, 2, 1], n_min=1) == [9, 2, 1]


def test_short_and_unmatched_sequences():
    assert propose([7]) == []
    assert propose([1, 2, 3]) == []


@pytest.mark.parametrize("seed", range(5))
def test_equals_a_brute_force_search(seed):
    rng = random.Random(seed)
    for _ in range(200):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        k, n_min = rng.randrange(1, 6), rng.randrange(1, 3)
        n_max = rng.randrange(n_min, 6)
        assert propose(tokens, k, n_min, n_max) == brute_force(tokens, k, n_min, n_max)
