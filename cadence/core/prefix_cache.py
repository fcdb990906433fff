"""The prefix cache seam: which blocks hold the K/V of which token prefix.

The block pool (block_pool.py) and the KV manager (kv_cache.py) talk to a cache only
through `PrefixCache`; they never ask which kind it is.

    NoPrefixCache      --no-enable-prefix-caching: nothing is ever found
    HashPrefixCache    vLLM's bet (hash_prefix_cache.py): a map from chained block hashes;
                       a freed block stays in the pool's free queue and keeps its hash until
                       it is reused, so the free queue's order is the eviction order (LRU)
    RadixPrefixCache   SGLang's bet (radix_cache.py): a radix tree of token blocks that keeps
                       its unreferenced blocks out of the free queue and evicts them leaf
                       first, in the order of a pluggable `EvictionPolicy` (LRU or LFU)

Events, from the pool:
    on_reference(block)  an unreferenced block is taken again (a hit): True if the cache
                         held it outside the free queue (else the pool takes it off the queue)
    on_release(block)    a block lost its last reference: True if the cache keeps it outside
                         the free queue (else it joins the queue's tail)
    on_reuse(block)      a block leaves the free queue to hold new data: forget its prefix
    evict(n)             the free queue runs short: up to n blocks the cache lets go of

KV groups (kv_cache.py): a model whose layers keep K/V for different spans (interleaved
local and global attention) holds one block list per group of layers, and a block of one
group holds nothing another group could use. Lookups and inserts name the group; a cache
that keys by block hashes keeps each group's prefixes apart. A cache that cannot have holes
in a request's blocks (`allows_released_prefix` False) is only ever asked for group 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from cadence.core.block import KVBlock
from cadence.core.request import Request


class PrefixCache(ABC):
    kind = "off"
    # Requests' block hashes (Request.block_hashes), where this cache keys by them.
    block_hasher: Callable[[Request], list[bytes]] | None = None
    # Whether a request may let go of its leading blocks while it runs (sliding windows),
    # and so hold blocks in several KV groups: a cache that inserts a request's blocks as
    # one path from its first block may not.
    allows_released_prefix = True

    @property
    @abstractmethod
    def num_evictable(self) -> int:
        """Unreferenced blocks the cache holds outside the free queue (they count as free)."""

    @property
    @abstractmethod
    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached prefix (reusable on a hit, evictable)."""

    @property
    @abstractmethod
    def num_evictions(self) -> int:
        """Cached blocks given up for other data, since start."""

    @abstractmethod
    def match(
        self, request: Request, max_blocks: int, touch: bool = True, group: int = 0
    ) -> list[KVBlock]:
        """Blocks of the request's longest cached prefix in KV group `group`, at most
        `max_blocks`. `touch`: count it as a use (eviction order); False only peeks."""

    def find(self, request: Request, max_blocks: int, group: int) -> list[KVBlock | None]:
        """Each of the request's first `max_blocks` blocks that `group` has cached, None
        where it has not: what a sliding-window group needs, which reads only the blocks
        inside its window. (A cache that knows only whole prefixes finds a prefix.)"""
        hits: list[KVBlock | None] = list(self.match(request, max_blocks, False, group))
        return hits + [None] * (max_blocks - len(hits))

    @abstractmethod
    def insert(
        self,
        request: Request,
        blocks: Sequence[KVBlock],
        start: int,
        num_tokens: int,
        group: int = 0,
    ) -> int:
        """Name the request's full blocks of KV group `group` among its first `num_tokens`
        tokens (their K/V is, or is being, written); blocks before `start` were named
        earlier. Returns the number of leading blocks named now (the next call's `start`)."""

    def on_reference(self, block: KVBlock) -> bool:
        return False

    def on_release(self, block: KVBlock) -> bool:
        return False

    def on_reuse(self, block: KVBlock) -> None:
        return None

    def evict(self, num_blocks: int) -> list[KVBlock]:
        return []

    def holds(self, block: KVBlock) -> bool:
        """Whether the cache holds the block outside the free queue."""
        return False

    @abstractmethod
    def reset(self) -> list[KVBlock]:
        """Forget every prefix (no block is referenced); returns the blocks it held outside
        the free queue, for the pool to put back."""

    def check_integrity(self, blocks: list[KVBlock], in_queue: set[int]) -> None:
        """Raise AssertionError if the cache's own accounting is inconsistent."""
        return None


class NoPrefixCache(PrefixCache):
    """Prefix caching off: every request computes its whole prompt."""

    num_evictable = 0
    num_cached_free = 0
    num_evictions = 0

    def match(
        self, request: Request, max_blocks: int, touch: bool = True, group: int = 0
    ) -> list[KVBlock]:
        return []

    def insert(
        self,
        request: Request,
        blocks: Sequence[KVBlock],
        start: int,
        num_tokens: int,
        group: int = 0,
    ) -> int:
        return len(blocks)  # nothing to name: every block is as settled as it gets

    def reset(self) -> list[KVBlock]:
        return []
