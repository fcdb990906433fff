"""KV groups in the KV manager: a model with interleaved local and global layers holds one
block list per group. The global group keeps every block; a sliding group lets go of what
falls behind its window. Groups never share a block, a prefix hit needs, per group, only
what that group's layers read, and the pool's accounting covers every group. Plain
numbers, no model (the zoo's tests run the same with Gemma 2/3, Cohere2 and Qwen2)."""

from __future__ import annotations

import pytest
from test_kv_cache import BS, compute, make_request

from cadence.core.block import RELEASED_BLOCK
from cadence.core.kv_cache import KVCacheManager

W = 6  # the local layers' window: a query sees itself and the 5 keys before it


def held(kv: KVCacheManager, group: int, rid: str) -> list[int]:
    """Positions (block indices) where the request holds a block in `group`."""
    blocks = kv.groups[group].req_blocks[rid]
    return [i for i, b in enumerate(blocks) if b is not RELEASED_BLOCK]


def group_manager(num_blocks: int, **kw) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, windows=(None, W), **kw)


def test_the_global_group_keeps_every_block_and_the_local_one_its_window():
    kv = group_manager(32)
    req = make_request("a", list(range(40)))  # 10 blocks
    for _ in range(5):
        compute(kv, req, 8)
    assert held(kv, 0, "a") == list(range(10))
    # The last chunk started at 32: its first query reads keys from 27 on (block 6).
    assert held(kv, 1, "a") == [6, 7, 8, 9]
    ids = kv.get_group_block_ids("a")
    assert len(ids[0]) == len(ids[1]) == 10  # a position indexes both lists alike
    assert ids[1][:6] == [0] * 6  # block 0 stands where a block was released
    assert not set(ids[0]) & set(ids[1][6:])  # no block is in two groups
    assert kv.num_free_blocks == 32 - 10 - 4
    kv.free(req)
    kv.check_integrity()
    assert kv.num_free_blocks == 32


def test_an_allocation_that_does_not_fit_every_group_changes_nothing():
    kv = group_manager(5)
    req = make_request("a", list(range(12)))  # 3 blocks in each group: 6 > 5
    assert kv.allocate_slots(req, 12) is None
    assert "a" not in kv.req_blocks and "a" not in kv.groups[1].req_blocks
    assert kv.num_free_blocks == 5
    assert kv.allocate_slots(req, 8) is not None  # 2 + 2 fit


def test_a_hit_takes_every_global_block_and_only_the_local_window():
    kv = group_manager(32)
    prompt = list(range(30))
    first = make_request("first", prompt)
    compute(kv, first, 16)
    compute(kv, first)
    second = make_request("second", prompt)
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 28
    assert hits[0] == kv.groups[0].req_blocks["first"][:7]
    # Its first query is at 28 and reads keys from 23 on: blocks 5 and 6.
    assert hits[1][:5] == [RELEASED_BLOCK] * 5
    assert hits[1][5:] == kv.groups[1].req_blocks["first"][5:7]
    compute(kv, second, hits=hits)
    assert held(kv, 1, "second") == [5, 6, 7]
    for r in (first, second):
        kv.free(r)
    kv.check_integrity()
    assert kv.num_free_blocks == 32


def test_groups_never_hit_each_others_blocks():
    """The same tokens in another group are a different block (it holds other layers)."""
    kv = group_manager(32)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    local = kv.groups[1].req_blocks["a"][:2]
    kv.free(a)
    hits, _ = kv.get_computed_blocks(make_request("b", list(range(9))))
    assert not {b.block_id for b in hits[0]} & {b.block_id for b in local}
    assert hits[1] == local


def test_a_hit_shrinks_to_where_the_local_window_is_still_cached():
    kv = group_manager(16)
    a = make_request("a", list(range(17)))
    compute(kv, a)  # 4 full blocks in each group, all named
    global_blocks = kv.groups[0].req_blocks["a"][:4]
    local_blocks = kv.groups[1].req_blocks["a"][:4]
    kv.free(a)
    # Evict the local group's blocks 2 and 3, as the free queue would reuse them.
    for block in local_blocks[2:]:
        kv.pool.free_queue.remove(block)
        kv.cache.on_reuse(block)
        kv.pool.free_queue.append(block)
    b = make_request("b", list(range(17)))
    hits, num_hit = kv.get_computed_blocks(b)
    # A hit of 4 blocks would need local blocks 2-3 (keys from 11 on), of 3 block 2, and
    # of 2 blocks 0-1 (keys from 3 on): both cached.
    assert num_hit == 8
    assert hits == [global_blocks[:2], local_blocks[:2]]
    compute(kv, b, hits=hits)
    kv.check_integrity()


@pytest.mark.parametrize(
    ("windows", "chunk", "longest"),
    [
        ((None, W), 8, 44),  # 16 blocks: 11 global + at most 5 local (window 6 + chunk 8)
        ((W, W), 8, None),  # every group slides, windows and chunks fit: any length
        ((None, None), 8, 32),  # two global groups split the pool
    ],
)
def test_longest_sequence_one_request_can_hold_alone(windows, chunk, longest):
    kv = KVCacheManager(16, BS, windows=windows)
    assert kv.longest_alone(chunk) == longest


def test_the_radix_cache_refuses_several_groups():
    with pytest.raises(ValueError, match="radix prefix cache keeps one KV group"):
        KVCacheManager(16, BS, prefix_cache="radix", windows=(None, W))


@pytest.mark.parametrize("num_blocks", [19, 20])
def test_a_hit_in_the_free_queue_never_becomes_another_groups_new_block(num_blocks):
    """The local group's hits sit near the free queue's head (released early): they are
    taken before any group draws new blocks, so the global group cannot be handed one."""
    kv = group_manager(num_blocks)
    a = make_request("a", list(range(40)))
    for _ in range(5):
        compute(kv, a, 8)
    b = make_request("b", list(range(13)))  # shares a's first three blocks
    hits, _ = kv.get_computed_blocks(b)
    compute(kv, b, 1, hits)
    global_ids = {x.block_id for x in kv.groups[0].req_blocks["b"]}
    local_ids = {x.block_id for x in kv.groups[1].req_blocks["b"] if x is not RELEASED_BLOCK}
    assert not global_ids & local_ids
    kv.check_integrity()  # (which checks that no block is in two groups)
