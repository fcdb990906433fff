"""The router's per-replica prefix index: chained chunk keys, bounded, LRU."""

from __future__ import annotations

import pytest

from cadence.router.prefix_index import CHUNK_TOKENS, PrefixIndex, chunk_keys


def test_keys_name_whole_prefixes_of_full_chunks():
    a = list(range(40))
    keys = chunk_keys(a)
    assert len(keys) == 40 // CHUNK_TOKENS
    assert chunk_keys(a[:32]) == keys[:2]  # a prefix has the prefix's keys
    b = [999] + a[1:]
    assert chunk_keys(b)[0] != keys[0] and chunk_keys(b)[1] != keys[1]  # the chain differs
    assert chunk_keys(a[:15]) == []


def test_match_counts_leading_chunks_sent_before():
    index = PrefixIndex()
    sent = list(range(64))
    index.insert(chunk_keys(sent))
    assert index.match(chunk_keys(sent[:48] + [7] * 16)) == 3
    assert index.match(chunk_keys([5] + sent[1:])) == 0
    assert index.match([]) == 0


def test_the_oldest_prefixes_go_first_and_a_trunk_outlives_its_leaves():
    index = PrefixIndex(max_chunks=4)
    trunk = list(range(32))
    index.insert(chunk_keys(trunk + [1] * 16))  # 3 chunks: trunk (2) + a leaf
    index.insert(chunk_keys(trunk + [2] * 16))  # trunk again + another leaf: 4 in all
    index.insert(chunk_keys([9] * 16))  # a fifth chunk: the oldest leaf goes
    assert len(index) == 4
    assert index.match(chunk_keys(trunk + [1] * 16)) == 2  # its leaf is gone, the trunk stays
    assert index.match(chunk_keys(trunk + [2] * 16)) == 3
    with pytest.raises(ValueError):
        PrefixIndex(0)
