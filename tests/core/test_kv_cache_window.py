"""Sliding windows in the KV manager: when every layer sees only its last W keys, a request
lets go of the blocks wholly behind its next query's window, keeps its positions (the
block list holds RELEASED_BLOCK there), and the released blocks stay cached like a finished
request's. Plain numbers, no model (the zoo's tests run the same with models)."""

from __future__ import annotations

import pytest
from test_kv_cache import BS, compute, make_request

from cadence.core.block import RELEASED_BLOCK
from cadence.core.kv_cache import KVCacheManager

W = 6  # keys a query sees: itself and the 5 before it


def held(kv: KVCacheManager, rid: str) -> list[int]:
    return [i for i, b in enumerate(kv.req_blocks[rid]) if b is not RELEASED_BLOCK]


def test_a_long_prefill_in_chunks_holds_only_the_window_and_the_chunk():
    kv = KVCacheManager(num_blocks=16, block_size=BS, windows=(W,))
    req = make_request("a", list(range(40)))  # 10 blocks
    for _ in range(5):
        compute(kv, req, 8)
        # Before each chunk, blocks wholly before (computed - W + 1) go.
        first_seen = req.num_computed_tokens - 8 - W + 1
        assert held(kv, "a")[0] == max(first_seen, 0) // BS
    assert len(kv.req_blocks["a"]) == 10  # positions still index blocks
    # The last chunk started at 32: keys from 27 on (block 6) were still needed by it.
    assert held(kv, "a") == [6, 7, 8, 9]
    assert kv.get_block_ids("a")[:6] == [0] * 6  # the table names block 0 where released
    assert kv.num_window_releases == 6


def test_decoding_past_the_window_keeps_a_constant_number_of_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=BS, windows=(W,))
    req = make_request("d", list(range(5)))
    compute(kv, req)
    for step in range(60):  # 65 tokens: 17 blocks' worth through a pool of 8
        req.append_output_token(100 + step)
        compute(kv, req, 1)
        assert len(held(kv, "d")) <= -(-(W - 1 + 1) // BS) + 1
    kv.free(req)
    kv.check_integrity()
    assert kv.num_free_blocks == 8


def test_released_blocks_stay_cached_and_hits_behind_the_window_are_let_go_at_once():
    kv = KVCacheManager(num_blocks=32, block_size=BS, windows=(W,))
    prompt = list(range(30))
    first = make_request("first", prompt)
    compute(kv, first, 16)
    compute(kv, first)
    released_ids = {b.block_id for b in kv.pool.blocks if b.ref_cnt == 0 and b.block_hash}
    assert len(released_ids) == 2  # its second chunk (from 16) sees keys from 11 on
    second = make_request("second", prompt)
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 28  # every full block, the released ones included
    compute(kv, second, hits=hits)
    # Its first query is at 28: keys from 23 on; blocks 0-4 were touched and let go.
    assert held(kv, "second") == [5, 6, 7]
    for r in (first, second):
        kv.free(r)
    kv.check_integrity()
    assert kv.num_free_blocks == 32


def test_a_cached_prefix_longer_than_the_pool_still_admits():
    """The next turn of a conversation longer than the pool: its hits behind the window are
    never taken, so they cost no free blocks, and the request runs."""
    kv = KVCacheManager(num_blocks=16, block_size=BS, windows=(W,))
    first = make_request("turn1", list(range(64)))  # 16 blocks: the whole pool
    for _ in range(8):
        compute(kv, first, 8)
    kv.free(first)
    second = make_request("turn2", list(range(64)) + list(range(100, 112)))
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 64
    compute(kv, second, 8, hits=hits)  # the pool holds 16: taking all hits could not fit
    # Its first query is at 64: keys from 59 on; only block 14 of the hits is kept.
    assert held(kv, "turn2") == [14, 15, 16, 17]
    assert kv.num_released["turn2"] == 14
    compute(kv, second, 4)
    kv.free(second)
    kv.check_integrity()
    assert kv.num_free_blocks == 16


def test_the_radix_cache_keeps_every_block_held():
    """Its tree takes a request's blocks as one path from the root: no holes."""
    kv = KVCacheManager(num_blocks=16, block_size=BS, prefix_cache="radix", windows=(W,))
    req = make_request("r", list(range(40)))
    for _ in range(5):
        compute(kv, req, 8)
    assert held(kv, "r") == list(range(10))
    assert kv.num_window_releases == 0


def test_caching_off_releases_too():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=False, windows=(W,))
    req = make_request("n", list(range(40)))
    for _ in range(5):
        compute(kv, req, 8)
    assert held(kv, "n") == [6, 7, 8, 9]
    kv.free(req)
    assert kv.num_free_blocks == 16


@pytest.mark.parametrize(
    ("window", "chunk", "lookahead", "longest"),
    [
        (None, 8, 0, 64),  # no window: the pool's tokens
        (None, 8, 3, 61),  # less the lookahead slots
        (W, 8, 0, None),  # window 6 + chunk 8 fit in 16 blocks: any length
        (40, 30, 0, 64),  # they do not: the pool bounds it as without a window
    ],
)
def test_longest_sequence_one_request_can_hold_alone(window, chunk, lookahead, longest):
    kv = KVCacheManager(num_blocks=16, block_size=BS, windows=(window,))
    assert kv.longest_alone(chunk, lookahead) == longest
