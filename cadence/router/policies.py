"""Which replica gets a request.

    round-robin   in turn
    least-load    the fewest sequences held (the engine's running + waiting, plus what the
                  router sent since it last asked); ties in turn
    cache-aware   SGLang's bet: the replica whose prefix index matches the most of the
                  prompt, if that covers at least `cache_threshold` of it; else least-load.
                  When the loads are far apart (max - min > balance_abs and max > min x
                  balance_rel) it balances first, whatever the prefixes say.

Each policy sees only healthy replicas and the prompt's chunk keys (prefix_index.py), and
returns a Choice saying why. The router then records the prompt in the chosen replica's
index, whatever the policy (so every policy's hit rate can be estimated).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cadence.router.prefix_index import CHUNK_TOKENS
from cadence.router.replicas import Replica

POLICIES = ("round-robin", "least-load", "cache-aware")


@dataclass
class Choice:
    replica: Replica
    reason: str  # round_robin | least_load | cache_hit | balance | no_match
    matched_tokens: int = 0  # of the prompt, by the chosen replica's index (estimate)


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, replicas: list[Replica], keys: list[bytes]) -> Choice:
        r = replicas[next(self._turn) % len(replicas)]
        return Choice(r, "round_robin", r.prefixes.match(keys) * CHUNK_TOKENS)


class LeastLoad:
    name = "least-load"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def least_loaded(self, replicas: list[Replica]) -> Replica:
        low = min(r.load for r in replicas)
        ties = [r for r in replicas if r.load == low]
        return ties[next(self._turn) % len(ties)]

    def choose(self, replicas: list[Replica], keys: list[bytes]) -> Choice:
        r = self.least_loaded(replicas)
        return Choice(r, "least_load", r.prefixes.match(keys) * CHUNK_TOKENS)


class CacheAware(LeastLoad):
    name = "cache-aware"

    def __init__(
        self, cache_threshold: float = 0.5, balance_abs: int = 32, balance_rel: float = 1.5
    ) -> None:
        super().__init__()
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def choose(self, replicas: list[Replica], keys: list[bytes]) -> Choice:
        loads = [r.load for r in replicas]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            choice = Choice(self.least_loaded(replicas), "balance")
        else:
            matches = [r.prefixes.match(keys) for r in replicas]
            best = max(matches)
            if keys and best > 0 and best >= self.cache_threshold * len(keys):
                # The longest match; among equals, the least loaded.
                ties = [r for r, m in zip(replicas, matches) if m == best]
                choice = Choice(self.least_loaded(ties), "cache_hit")
            else:
                choice = Choice(self.least_loaded(replicas), "no_match")
        choice.matched_tokens = choice.replica.prefixes.match(keys) * CHUNK_TOKENS
        return choice


def make_policy(name: str, **kw) -> RoundRobin | LeastLoad | CacheAware:
    if name == "round-robin":
        return RoundRobin()
    if name == "least-load":
        return LeastLoad()
    if name == "cache-aware":
        return CacheAware(**kw)
    raise ValueError(f"unknown routing policy {name!r}: one of {', '.join(POLICIES)}")
