"""The radix tree of cached prefixes: insert, split, match, LRU leaf eviction, locking."""

from __future__ import annotations

import pytest

from cadence.core.kv_cache import KVCacheManager
from cadence.core.request import Request
from cadence.sampling_params import SamplingParams

BS = 4


def make(num_blocks: int = 32, eviction: str = "lru") -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, True, "radix", eviction)


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def run_prefill(kv: KVCacheManager, r: Request) -> list[int]:
    """Admit a request as the scheduler would: take its hits, allocate, mark computed."""
    hits, n = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - n, hits) is not None
    r.num_computed_tokens = r.num_tokens
    kv.check_integrity()
    return kv.get_block_ids(r.request_id)


def test_insert_then_match_returns_the_same_blocks():
    kv = make()
    a = req("a", list(range(13)))  # 3 full blocks + 1 token
    ids = run_prefill(kv, a)
    b = req("b", list(range(13)) + [99])
    hits, n = kv.get_computed_blocks(b)
    assert n == 12 and [h.block_id for h in hits[0]] == ids[:3]


def test_divergence_mid_edge_splits_it():
    kv = make()
    run_prefill(kv, req("a", list(range(17))))  # one edge of 4 blocks
    tree = kv.cache.tree
    assert len(tree.nodes()) == 1
    b_tokens = list(range(8)) + [50 + i for i in range(9)]  # shares 2 blocks, then differs
    run_prefill(kv, req("b", b_tokens))
    nodes = tree.nodes()
    assert len(nodes) == 3  # trunk (2 blocks) + two branches
    trunk = tree.root.children[tuple(range(4))]
    assert len(trunk.blocks) == 2 and len(trunk.children) == 2
    kv.check_integrity()


def test_last_token_is_never_a_hit():
    kv = make()
    run_prefill(kv, req("a", list(range(8))))
    hits, n = kv.get_computed_blocks(req("b", list(range(8))))
    assert n == 4  # exactly two full blocks: only the first may be reused


def test_locked_nodes_survive_eviction_and_lru_leaves_go_first():
    kv = make(num_blocks=12)
    a, b, c = req("a", list(range(9))), req("b", list(range(4)) + [7] * 5), req("c", [3] * 9)
    for r in (a, b, c):
        run_prefill(kv, r)
    kv.free(a)  # a's own blocks become evictable; the shared first block is still b's
    kv.free(c)
    kv.check_integrity()
    tree = kv.cache.tree
    # Full blocks only live in the tree: a's second block (its first is b's too) and c's two.
    assert tree.num_evictable == 1 + 2
    held_by_b = set(kv.get_block_ids("b")[:2])  # its two full blocks (the third is partial)
    (evicted,) = kv.cache.evict(1)
    assert evicted.node is None and evicted.ref_cnt == 0
    kv.pool.free_queue.append(evicted)  # (what the pool does with it)
    # b's blocks are referenced: never evicted, whatever is asked
    for block in kv.cache.evict(100):
        kv.pool.free_queue.append(block)
    assert held_by_b <= {blk.block_id for n in tree.nodes() for blk in n.blocks}
    kv.check_integrity()


def test_eviction_order_is_least_recently_used_leaf():
    kv = make(num_blocks=20)
    old, new = req("old", [1] * 8 + [0]), req("new", [2] * 8 + [0])
    run_prefill(kv, old)
    run_prefill(kv, new)
    kv.free(old)
    kv.free(new)
    kv.get_computed_blocks(req("x", [2] * 8 + [5]))  # touches "new"'s path
    tree = kv.cache.tree
    tree.evict(2)
    remaining = {n.tokens[:4] for n in tree.nodes()}
    assert remaining == {(2, 2, 2, 2)}


def test_no_block_leaked_after_everything_finishes():
    import random

    rng = random.Random(0)
    kv = make(num_blocks=40)
    live: list[Request] = []
    for i in range(300):
        if live and (rng.random() < 0.5 or kv.num_free_blocks < 6):
            kv.free(live.pop(rng.randrange(len(live))))
        else:
            prefix = rng.choice([[1] * 8, [2] * 12, [3] * 4, []])
            r = req(str(i), prefix + [rng.randrange(100) for _ in range(rng.randrange(1, 10))])
            hits, n = kv.get_computed_blocks(r)
            if kv.allocate_slots(r, r.num_tokens - n, hits) is None:
                continue
            r.num_computed_tokens = r.num_tokens
            live.append(r)
        kv.check_integrity()
    for r in live:
        kv.free(r)
    kv.check_integrity()
    assert kv.num_free_blocks == 40
    assert kv.cache.tree.nodes()  # the cache still holds prefixes
    assert kv.cache.tree.num_evictions > 0


def test_reset_empties_the_tree():
    kv = make()
    r = req("a", list(range(9)))
    run_prefill(kv, r)
    assert not kv.reset_prefix_cache()  # a request still holds blocks
    kv.free(r)
    assert kv.reset_prefix_cache()
    assert kv.cache.tree.nodes() == [] and kv.pool.free_queue.num_free == 32


def test_bad_prefix_cache_name():
    with pytest.raises(ValueError, match="radix"):
        KVCacheManager(8, 4, prefix_cache="trie")


def test_lfu_eviction_keeps_the_often_hit_prefix_that_lru_would_drop():
    """Two cached prompts; the older one was hit twice, the newer one never. LRU evicts the
    older (least recently used), LFU the newer (least often used)."""
    survivors = {}
    for policy in ("lru", "lfu"):
        kv = make(num_blocks=6, eviction=policy)
        hot, cold = list(range(9)), [5] * 9  # two full blocks each, and a partial one
        for i, prompt in enumerate([hot, hot, hot, cold]):
            r = req(f"{policy}{i}", prompt)
            run_prefill(kv, r)
            kv.free(r)
        assert kv.pool.free_queue.num_free == 2 and kv.cache.num_evictable == 4
        kv.pool.get_new_blocks(3)  # one more than the queue holds: the cache gives one up
        assert kv.cache.num_evictions == 1
        survivors[policy] = kv.cached_prefix_len(req("hot?", hot + [1]))
    assert survivors["lru"] == BS  # hot lost its second block
    assert survivors["lfu"] == 2 * BS  # hot kept whole; cold paid


def test_an_unknown_eviction_policy_is_refused():
    with pytest.raises(ValueError, match="eviction policy"):
        make(eviction="random")
