"""Routing policies: round-robin, least-load and cache-aware (with its load guard)."""

from __future__ import annotations

import pytest

from cadence.router.policies import CacheAware, LeastLoad, RoundRobin, make_policy
from cadence.router.prefix_index import chunk_keys
from cadence.router.replicas import Replica


def replicas(*loads: int) -> list[Replica]:
    return [
        Replica(f"http://r{i}", i, healthy=True, engine_load=load) for i, load in enumerate(loads)
    ]


def test_round_robin_takes_turns():
    rs = replicas(0, 0, 0)
    policy = RoundRobin()
    assert [policy.choose(rs, []).replica.index for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_least_load_counts_what_was_sent_since_the_last_poll():
    rs = replicas(3, 1, 1)
    policy = LeastLoad()
    first = policy.choose(rs, []).replica
    assert first.index in (1, 2)
    first.sent_since_poll += 1  # the router does this when it forwards
    assert policy.choose(rs, []).replica.index == ({1, 2} - {first.index}).pop()
    rs[1].in_flight = 9  # in flight here outweighs a stale poll
    rs[2].sent_since_poll = 0
    assert policy.choose(rs, []).replica.index == 2


def test_cache_aware_follows_the_longest_prefix_above_the_threshold():
    rs = replicas(0, 0)
    policy = CacheAware(cache_threshold=0.5)
    system = list(range(64))
    rs[1].prefixes.insert(chunk_keys(system + [1] * 16))
    keys = chunk_keys(system + [2] * 16)  # shares 4 of 5 chunks with what r1 was sent
    choice = policy.choose(rs, keys)
    assert (choice.replica.index, choice.reason, choice.matched_tokens) == (1, "cache_hit", 64)
    short = chunk_keys(system[:16] + [3] * 48)  # 1 of 4 chunks: under the threshold
    assert policy.choose(rs, short).reason == "no_match"


def test_cache_aware_balances_first_when_loads_are_far_apart():
    rs = replicas(40, 2)
    prompt = chunk_keys(list(range(64)))
    rs[0].prefixes.insert(prompt)
    choice = CacheAware(balance_abs=32, balance_rel=1.5).choose(rs, prompt)
    assert (choice.replica.index, choice.reason) == (1, "balance")
    rs[1].engine_load = 20  # 40 - 20 is within the absolute bound: the prefix wins
    assert CacheAware(balance_abs=32).choose(rs, prompt).replica.index == 0


def test_unknown_policy_and_bad_threshold_are_errors():
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="cache_threshold"):
        make_policy("cache-aware", cache_threshold=2.0)
