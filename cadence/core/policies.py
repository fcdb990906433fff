"""The order in which waiting requests are admitted (`--scheduling-policy`).

    fcfs        arrival order; a preempted request goes back to the front (the default)
    priority    smaller `priority` value first, then arrival; a waiting request may preempt
                a running one of a larger value when there is no room for it
    lpm         longest cached prefix first (SGLang's cache-aware policy)
    dfs-weight  requests sharing a prefix grouped together: a depth-first walk of a trie of
                the waiting prompts, heavier subtrees (more requests) first

Aging (cache-aware policies): a request that has waited `aging_steps` scheduler steps is
*aged* and goes ahead of every non-aged request, aged ones in arrival order. So no request
waits more than `aging_steps` steps plus the time the requests aged before it take to be
admitted, however the cache favours others.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable

from cadence.config import SCHEDULING_POLICIES
from cadence.core.request import Request

POLICIES = SCHEDULING_POLICIES  # (named in config, which validates them)


class SchedulingPolicy:
    name = "fcfs"
    preemptive = False  # may a waiting request preempt a running one?

    def __init__(self, aging_steps: int) -> None:
        self.aging_steps = aging_steps

    def order(
        self,
        waiting: deque[Request],
        step: int,
        cached_len: Callable[[Request], int],
        block_size: int,
    ) -> None:
        """Reorder `waiting` in place, best first."""


class Priority(SchedulingPolicy):
    name = "priority"
    preemptive = True

    def order(self, waiting, step, cached_len, block_size) -> None:
        items = sorted(waiting, key=lambda r: (r.priority, r.arrival_time))
        waiting.clear()
        waiting.extend(items)


class _CacheAware(SchedulingPolicy, abc.ABC):
    def order(self, waiting, step, cached_len, block_size) -> None:
        aged = [r for r in waiting if step - r.enqueue_step >= self.aging_steps]
        aged.sort(key=lambda r: r.arrival_time)
        aged_ids = {id(r) for r in aged}
        fresh = [r for r in waiting if id(r) not in aged_ids]
        fresh = self._rank(fresh, cached_len, block_size)
        waiting.clear()
        waiting.extend(aged + fresh)

    @abc.abstractmethod
    def _rank(self, reqs: list[Request], cached_len, block_size: int) -> list[Request]:
        """The non-aged requests, best first."""


class LongestPrefixMatch(_CacheAware):
    name = "lpm"

    def _rank(self, reqs, cached_len, block_size):
        return sorted(reqs, key=lambda r: (-cached_len(r), r.arrival_time))


class DFSWeight(_CacheAware):
    name = "dfs-weight"

    def _rank(self, reqs, cached_len, block_size):
        # A trie over the prompts, block by block: node = (children dict, requests ending here).
        root: dict = {}

        def node_of(path_node: dict, key) -> dict:
            return path_node.setdefault(
                key, {"children": {}, "reqs": [], "weight": 0, "first": None}
            )

        for r in reqs:
            tokens = r.all_token_ids
            cur = {"children": root}
            n_blocks = max(1, len(tokens) // block_size)
            for i in range(n_blocks):
                key = tuple(tokens[i * block_size : (i + 1) * block_size])
                nxt = node_of(cur["children"], key)
                nxt["weight"] += 1
                if nxt["first"] is None or r.arrival_time < nxt["first"]:
                    nxt["first"] = r.arrival_time
                cur = nxt
            cur["reqs"].append(r)
        out: list[Request] = []
        stack = [sorted(root.values(), key=lambda n: (-n["weight"], n["first"]), reverse=True)]
        # iterative DFS: heavier (then older) children first
        while stack:
            level = stack[-1]
            if not level:
                stack.pop()
                continue
            node = level.pop()
            out.extend(sorted(node["reqs"], key=lambda r: r.arrival_time))
            children = sorted(
                node["children"].values(), key=lambda n: (-n["weight"], n["first"]), reverse=True
            )
            if children:
                stack.append(children)
        return out


def make_policy(name: str, aging_steps: int) -> SchedulingPolicy:
    classes = {
        "fcfs": SchedulingPolicy,
        "priority": Priority,
        "lpm": LongestPrefixMatch,
        "dfs-weight": DFSWeight,
    }
    if name not in classes:
        raise ValueError(f"unknown scheduling policy {name!r}; choose from {', '.join(POLICIES)}")
    if aging_steps < 1:
        raise ValueError(f"scheduling_aging_steps must be positive, got {aging_steps}")
    return classes[name](aging_steps)
