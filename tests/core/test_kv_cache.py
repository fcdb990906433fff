"""The KV block pool, the prefix cache and the per-request manager, without any model.

Everything here is plain numbers: a pool of N blocks of B tokens, requests of token ids, and
the accounting that says which block holds what (see DESIGN.md §3).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from cadence.core.block import FreeBlockQueue, KVBlock
from cadence.core.block_pool import BlockPool
from cadence.core.hash_prefix_cache import (
    NONE_HASH,
    HashPrefixCache,
    hash_block_tokens,
    make_block_hasher,
)
from cadence.core.kv_cache import KVCacheManager
from cadence.core.request import Request
from cadence.sampling_params import SamplingParams

BS = 4  # block size used throughout: small enough to reason about by hand


def make_request(rid: str, tokens: list[int], block_size: int = BS) -> Request:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=16),
        eos_token_ids=(),
        arrival_time=0.0,
        block_hasher=make_block_hasher(block_size),
    )


def compute(kv: KVCacheManager, req: Request, num_new: int | None = None, hits=()) -> list:
    """What the scheduler does for one step: allocate, then the forward computes the tokens.
    `hits`: a prefix hit (blocks per KV group). Returns the first group's new blocks."""
    num_hit_tokens = len(hits[0]) * kv.block_size if hits else 0
    if num_new is None:
        num_new = req.num_tokens - req.num_computed_tokens - num_hit_tokens
    new = kv.allocate_slots(req, num_new, hits)
    assert new is not None, "test setup: the pool was expected to have room"
    req.num_computed_tokens += num_hit_tokens + num_new
    kv.check_integrity()
    return new[0]


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_queue]


def snapshot(kv: KVCacheManager):
    """Everything allocate_slots could change, in comparable form."""
    return (
        free_ids(kv.pool),
        [(b.ref_cnt, b.block_hash) for b in kv.pool.blocks],
        dict(kv.cache.cached),
        {rid: [b.block_id for b in bs] for rid, bs in kv.req_blocks.items()},
        dict(kv.num_cached_blocks),
        kv.cache.num_evictions,
    )


# ---- FreeBlockQueue -------------------------------------------------------------------------


def test_free_queue_pops_blocks_in_the_order_they_were_appended():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert len(q) == 5
    assert [q.popleft().block_id for _ in range(5)] == [0, 1, 2, 3, 4]
    assert len(q) == 0


def test_free_queue_popleft_on_an_empty_queue_raises():
    q = FreeBlockQueue([])
    with pytest.raises(ValueError):
        q.popleft()


def test_free_queue_removes_a_block_from_the_middle_through_its_own_links():
    """remove() touches only the block and its two neighbours (O(1)), never searches."""
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3, 4]
    assert len(q) == 4
    assert blocks[1].next_free is blocks[3]
    assert blocks[3].prev_free is blocks[1]
    assert blocks[2].prev_free is None and blocks[2].next_free is None
    # Head and tail can be removed the same way.
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert [b.block_id for b in q] == [1, 3]
    assert q.popleft() is blocks[1]


def test_free_queue_appends_at_the_tail():
    blocks = [KVBlock(i) for i in range(4)]
    q = FreeBlockQueue(blocks[:3])
    q.remove(blocks[0])
    q.append(blocks[3])
    q.append(blocks[0])
    assert [b.block_id for b in q] == [1, 2, 3, 0]
    assert len(q) == 4


# ---- hashing --------------------------------------------------------------------------------


def test_block_hash_is_a_sha256_digest_of_parent_and_token_bytes():
    """Stable bytes that any process computes alike: not Python's salted hash()."""
    h = hash_block_tokens(None, [1, 2, 3, 4])
    assert isinstance(h, bytes) and len(h) == 32
    assert h == hash_block_tokens(None, [1, 2, 3, 4])
    expected = hashlib.sha256(NONE_HASH + np.asarray([1, 2, 3, 4], np.int64).tobytes()).digest()
    assert h == expected
    child = hash_block_tokens(h, [5, 6, 7, 8])
    assert child == hashlib.sha256(h + np.asarray([5, 6, 7, 8], np.int64).tobytes()).digest()


def test_same_tokens_under_a_different_parent_hash_differently():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    b = hash_block_tokens(None, [9, 9, 9, 9])
    assert hash_block_tokens(a, [5, 6, 7, 8]) != hash_block_tokens(b, [5, 6, 7, 8])
    assert hash_block_tokens(a, [5, 6, 7, 8]) != hash_block_tokens(None, [5, 6, 7, 8])


def test_extra_keys_change_the_hash():
    assert hash_block_tokens(None, [1, 2, 3, 4], b"lora-1") != hash_block_tokens(
        None, [1, 2, 3, 4], b"lora-2"
    )
    assert hash_block_tokens(None, [1, 2, 3, 4], b"x") != hash_block_tokens(None, [1, 2, 3, 4])


def test_block_hasher_hashes_only_full_blocks_and_chains_them():
    req = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert len(req.block_hashes) == 2
    h0 = hash_block_tokens(None, [0, 1, 2, 3])
    h1 = hash_block_tokens(h0, [4, 5, 6, 7])
    assert req.block_hashes == [h0, h1]
    req.append_output_token(10)
    assert len(req.block_hashes) == 2  # 11 tokens: still two full blocks
    req.append_output_token(11)
    assert req.block_hashes == [h0, h1, hash_block_tokens(h1, [8, 9, 10, 11])]


def test_one_hash_names_a_whole_prefix():
    """Equal prefixes give equal hashes; a difference anywhere changes every later hash."""
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8])
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 9])
    c = make_request("c", [0, 2, 3, 4, 5, 6, 7, 8])
    assert a.block_hashes[0] == b.block_hashes[0]
    assert a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[0] != c.block_hashes[0]
    assert a.block_hashes[1] != c.block_hashes[1]  # same second block, different parent


# ---- BlockPool ------------------------------------------------------------------------------


def test_pool_needs_at_least_one_block():
    with pytest.raises(ValueError):
        BlockPool(0)
    with pytest.raises(ValueError):
        KVCacheManager(4, 0)


def test_fresh_pool_hands_out_blocks_in_id_order():
    pool = BlockPool(6)
    assert [b.block_id for b in pool.get_new_blocks(3)] == [0, 1, 2]
    assert pool.num_free_blocks == 3
    assert pool.usage == pytest.approx(0.5)


def test_blocks_freed_earliest_are_reused_first():
    pool = BlockPool(6)
    a, b, c = pool.get_new_blocks(1), pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.free(b)
    pool.free(a)
    pool.free(c)
    # Never-used blocks 3..5 were freed at start; then b, a, c in that order.
    assert free_ids(pool) == [3, 4, 5, 1, 0, 2]
    assert [x.block_id for x in pool.get_new_blocks(5)] == [3, 4, 5, 1, 0]


def test_asking_for_more_blocks_than_are_free_raises_and_takes_none():
    pool = BlockPool(3)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    assert pool.num_free_blocks == 1


def hash_pool(num_blocks: int) -> tuple[BlockPool, HashPrefixCache]:
    cache = HashPrefixCache(block_size=4)
    return BlockPool(num_blocks, cache), cache


def test_reusing_a_cached_free_block_evicts_its_hash():
    pool, cache = hash_pool(1)
    (block,) = pool.get_new_blocks(1)
    h = hash_block_tokens(None, [1, 2, 3, 4])
    cache.cache_block(block, h)
    pool.free([block])
    assert cache.lookup(h) is block  # free but still cached
    assert block.block_hash == h
    (again,) = pool.get_new_blocks(1)
    assert again is block
    assert cache.lookup(h) is None and block.block_hash is None
    assert cache.num_evictions == 1


def test_one_block_per_hash_a_duplicate_stays_private():
    pool, cache = hash_pool(2)
    first, second = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [1, 2, 3, 4])
    cache.cache_block(first, h)
    cache.cache_block(second, h)
    assert cache.lookup(h) is first
    assert second.block_hash is None


def test_reset_prefix_cache_only_when_no_block_is_held():
    pool, cache = hash_pool(2)
    (block,) = pool.get_new_blocks(1)
    cache.cache_block(block, hash_block_tokens(None, [1]))
    assert pool.reset_prefix_cache() is False
    assert cache.cached
    pool.free([block])
    assert pool.reset_prefix_cache() is True
    assert not cache.cached and block.block_hash is None


# ---- KVCacheManager -------------------------------------------------------------------------


def test_allocate_slots_covers_computed_plus_new_tokens_rounded_up_to_blocks():
    kv = KVCacheManager(10, BS)
    req = make_request("a", list(range(10)))
    assert len(compute(kv, req, 5)) == 2  # 5 tokens -> 2 blocks
    assert len(compute(kv, req, 3)) == 0  # 8 tokens still fit in 2 blocks
    assert len(compute(kv, req, 2)) == 1  # 10 tokens -> 3 blocks
    assert kv.get_block_ids("a") == [0, 1, 2]
    assert kv.num_free_blocks == 7


def test_full_blocks_are_cached_as_they_become_computed():
    kv = KVCacheManager(10, BS)
    req = make_request("a", list(range(6)))
    compute(kv, req)  # 6 tokens: one full block, one partial
    blocks = kv.req_blocks["a"]
    assert blocks[0].block_hash == req.block_hashes[0]
    assert blocks[1].block_hash is None
    assert len(kv.cache.cached) == 1
    # Decoding fills the second block: it is cached on the step that computes its last token.
    req.append_output_token(100)
    compute(kv, req)
    req.append_output_token(101)
    assert len(req.block_hashes) == 2
    compute(kv, req)
    assert blocks[1].block_hash == req.block_hashes[1]
    assert kv.cache.lookup(req.block_hashes[1]) is blocks[1]


def test_blocks_are_freed_tail_first_so_a_shared_trunk_outlives_its_leaves():
    kv = KVCacheManager(4, BS)
    req = make_request("a", list(range(12)))
    compute(kv, req)  # blocks 0, 1, 2 (all cached); block 3 never used
    kv.free(req)
    assert free_ids(kv.pool) == [3, 2, 1, 0]
    # Two new blocks evict the unused block and the leaf; the trunk (0, 1) stays cached.
    other = make_request("b", [99] * 5)
    compute(kv, other)
    assert kv.get_block_ids("b") == [3, 2]
    assert kv.cache.lookup(req.block_hashes[0]) is kv.pool.blocks[0]
    assert kv.cache.lookup(req.block_hashes[1]) is kv.pool.blocks[1]
    assert kv.cache.lookup(req.block_hashes[2]) is None


def test_requests_freed_earlier_lose_their_cached_blocks_first():
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(8)))
    b = make_request("b", list(range(100, 108)))
    compute(kv, a)
    compute(kv, b)
    kv.free(a)
    kv.free(b)
    c = make_request("c", list(range(200, 208)))
    compute(kv, c)
    assert all(kv.cache.lookup(h) is None for h in a.block_hashes)
    assert all(kv.cache.lookup(h) is not None for h in b.block_hashes)


def test_get_computed_blocks_finds_the_longest_cached_prefix():
    kv = KVCacheManager(16, BS)
    a = make_request("a", list(range(13)))  # 3 full blocks
    compute(kv, a)
    b = make_request("b", list(range(8)) + [50, 51, 52, 53, 54])  # shares 2 blocks
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    assert hits == [kv.req_blocks["a"][:2]]  # (one KV group)


def test_get_computed_blocks_always_leaves_the_last_token_to_compute():
    """A prompt of exactly N full blocks gets N-1 blocks of hits: its last logits are needed."""
    kv = KVCacheManager(16, BS)
    a = make_request("a", list(range(12)))  # exactly 3 blocks
    compute(kv, a)
    kv.free(a)
    same = make_request("b", list(range(12)))
    hits, n = kv.get_computed_blocks(same)
    assert len(hits[0]) == 2 and n == 8
    longer = make_request("c", list(range(13)))  # one token more: all 3 blocks hit
    hits, n = kv.get_computed_blocks(longer)
    assert len(hits[0]) == 3 and n == 12
    one_block = make_request("d", list(range(4)))
    assert kv.get_computed_blocks(one_block) == ([[]], 0)


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_free_queue():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    trunk = kv.req_blocks["a"][:2]
    kv.free(a)
    assert all(blk.ref_cnt == 0 and blk.block_id in free_ids(kv.pool) for blk in trunk)
    b = make_request("b", list(range(9)))
    hits, n = kv.get_computed_blocks(b)
    assert hits == [trunk] and n == 8
    free_before = kv.num_free_blocks
    new = compute(kv, b, 1, hits)
    assert len(new) == 1
    assert all(blk.ref_cnt == 1 and blk.block_id not in free_ids(kv.pool) for blk in trunk)
    assert kv.num_free_blocks == free_before - 3  # two revived hits + one new block
    assert kv.req_blocks["b"][:2] == trunk
    assert b.num_computed_tokens == 9


def test_a_block_shared_by_two_requests_is_freed_only_when_both_free_it():
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(6)))
    compute(kv, a)
    shared = kv.req_blocks["a"][0]
    b = make_request("b", list(range(4)) + [70, 71])
    hits, _ = kv.get_computed_blocks(b)
    assert hits == [[shared]]
    compute(kv, b, 2, hits)
    assert shared.ref_cnt == 2
    assert kv.req_blocks["b"][0] is shared
    kv.free(a)
    kv.check_integrity()
    assert shared.ref_cnt == 1
    assert shared.block_id not in free_ids(kv.pool)
    kv.free(b)
    kv.check_integrity()
    assert shared.ref_cnt == 0
    assert shared.block_id in free_ids(kv.pool)
    assert kv.num_free_blocks == 8


def test_allocate_slots_returns_none_and_changes_nothing_when_the_pool_is_short():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(8)))
    compute(kv, a)
    b = make_request("b", list(range(100, 108)))
    before = snapshot(kv)
    assert kv.allocate_slots(b, 8) is None  # needs 2 blocks, 1 free
    assert snapshot(kv) == before
    assert "b" not in kv.req_blocks
    # A request that already holds blocks keeps exactly those.
    c = make_request("c", list(range(200, 216)))
    kv.free(a)
    compute(kv, c, 8)
    before = snapshot(kv)
    assert kv.allocate_slots(c, 8) is None  # would need 2 more, 1 free
    assert snapshot(kv) == before
    kv.check_integrity()


def test_reviving_cached_hits_costs_free_blocks_too():
    """Hits that sit in the free queue leave it, so they count against what is free."""
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(9)))
    compute(kv, a)  # all 3 blocks; the first two are cached
    kv.free(a)
    b = make_request("b", list(range(8)) + list(range(300, 306)))  # 14 tokens: 4 blocks
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    before = snapshot(kv)
    # 2 revived hits + 2 new blocks > 3 free: refused without touching anything.
    assert kv.allocate_slots(b, 6, hits) is None
    assert snapshot(kv) == before
    # 2 revived hits + 1 new block fits exactly.
    compute(kv, b, 4, hits)
    assert kv.num_free_blocks == 0


def test_hits_held_by_another_request_cost_no_free_blocks():
    kv = KVCacheManager(3, BS)
    a = make_request("a", list(range(9)))
    compute(kv, a, 8)  # two cached blocks, held
    b = make_request("b", list(range(9)))
    hits, _ = kv.get_computed_blocks(b)
    assert len(hits[0]) == 2
    compute(kv, b, 1, hits)  # only one new block needed, one free
    assert kv.num_free_blocks == 0
    assert [blk.ref_cnt for blk in hits[0]] == [2, 2]


def test_caching_disabled_never_hits_and_never_hashes_blocks():
    kv = KVCacheManager(8, BS, enable_caching=False)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    kv.free(a)
    assert kv.cache.kind == "off" and kv.block_hasher is None
    assert all(b.block_hash is None and b.node is None for b in kv.pool.blocks)
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([[]], 0)


def test_free_of_a_request_without_blocks_is_a_no_op():
    kv = KVCacheManager(2, BS)
    kv.free(make_request("ghost", [1, 2]))
    kv.check_integrity()
    assert kv.num_free_blocks == 2


# ---- integrity check ------------------------------------------------------------------------


def _busy_manager() -> tuple[KVCacheManager, Request, Request]:
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    b = make_request("b", list(range(9)))
    hits, _ = kv.get_computed_blocks(b)
    compute(kv, b, 1, hits)
    kv.check_integrity()
    return kv, a, b


def test_integrity_check_catches_a_tampered_reference_count():
    kv, _, _ = _busy_manager()
    kv.req_blocks["a"][0].ref_cnt += 1
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_integrity_check_catches_a_held_block_left_in_the_free_queue():
    kv, _, _ = _busy_manager()
    kv.pool.free_queue.append(kv.req_blocks["b"][-1])
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_integrity_check_catches_a_block_that_is_neither_held_nor_free():
    kv, _, _ = _busy_manager()
    lost = kv.pool.free_queue.popleft()  # leaked: out of the queue, nobody holds it
    assert lost.ref_cnt == 0
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_integrity_check_catches_a_cache_entry_naming_the_wrong_block():
    kv, a, _ = _busy_manager()
    kv.cache.cached[a.block_hashes[0]] = kv.req_blocks["a"][1]
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_integrity_check_catches_a_forgotten_holder():
    kv, _, _ = _busy_manager()
    del kv.req_blocks["b"]
    with pytest.raises(AssertionError):
        kv.check_integrity()


@pytest.mark.parametrize("radix", [False, True], ids=["hash", "radix"])
def test_free_blocks_that_keep_a_prefix_are_counted_as_cached(radix):
    kv = KVCacheManager(8, BS, prefix_cache="radix" if radix else "hash")
    a = make_request("a", list(range(9)))  # two full blocks and one partial
    compute(kv, a)
    assert kv.num_cached_free_blocks == 0  # held, not free
    kv.free(a)
    assert kv.num_cached_free_blocks == 2  # the partial block keeps no prefix
    b = make_request("b", list(range(9)))
    hits, _ = kv.get_computed_blocks(b)
    compute(kv, b, 1, hits)
    assert kv.num_cached_free_blocks == 0  # both revived by the hit
    kv.free(b)
    c = make_request("c", list(range(100, 129)))  # needs 8 blocks: evicts the cached two
    compute(kv, c)
    assert kv.num_cached_free_blocks == 0
    kv.free(c)
    assert kv.reset_prefix_cache() and kv.num_cached_free_blocks == 0
