"""Which blocks each request holds: the scheduler's one door to the block pool.

    KVCacheManager
      pool            BlockPool (block_pool.py): blocks, reference counts, the free queue
      pool.cache      PrefixCache (prefix_cache.py): hash | radix | none, picked here
      req_blocks      request id -> its blocks, in token order

The manager never asks which prefix cache it has: `get_computed_blocks` asks the cache for a
request's longest cached prefix, `cache_blocks` tells it which full blocks now hold K/V.

KV groups: layers that keep K/V for different spans hold different blocks. Each group is
a set of attention layers with one window (None: the whole context); a request holds one
block list per group, all of the same length (a position indexes the same entry in each),
each group's blocks drawn from the one pool. A model whose layers all read alike has one
group; interleaved local and global layers (Gemma 2/3, Cohere2) have a global group and
local ones (the worker decides, `worker/kv_groups.py`: the layers of every group share
the pool's memory, so a block of any group costs the same).

Sliding windows: in a group whose layers see only their last W keys, a request's blocks
wholly behind the window of its next query token are released as it moves on (its list
keeps RELEASED_BLOCK in their place). They go back to the pool as a finished request's do:
still cached, reusable on a hit until evicted. A prefix hit takes, in such a group, only
the blocks inside the window of its first query, and needs only those cached. A long
sequence then holds about W / block_size + 1 blocks in the group, not one per block of
its context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cadence.core.block import RELEASED_BLOCK, KVBlock
from cadence.core.block_pool import BlockPool
from cadence.core.hash_prefix_cache import HashPrefixCache
from cadence.core.prefix_cache import NoPrefixCache, PrefixCache
from cadence.core.radix_cache import RadixPrefixCache
from cadence.core.request import Request

PREFIX_CACHES = ("hash", "radix")


def make_prefix_cache(kind: str, block_size: int, eviction: str = "lru") -> PrefixCache:
    """The prefix cache named `kind` ("hash", "radix", or "off")."""
    if kind == "hash":
        return HashPrefixCache(block_size)
    if kind == "radix":
        return RadixPrefixCache(block_size, eviction)
    if kind == "off":
        return NoPrefixCache()
    raise ValueError(f"prefix_cache must be 'hash' or 'radix', got {kind!r}")


def prefix_cache_allows_holes(kind: str, enabled: bool = True) -> bool:
    """Whether requests may release blocks behind windows and hold several KV groups with
    this prefix cache (see PrefixCache.allows_released_prefix): a class attribute, read
    without building the cache."""
    classes = {"hash": HashPrefixCache, "radix": RadixPrefixCache, "off": NoPrefixCache}
    if kind not in classes:
        make_prefix_cache(kind, 1)  # (raises the error that names the kinds)
    return not enabled or classes[kind].allows_released_prefix


@dataclass
class PrefixCacheStats:
    """Counted by the scheduler when a lookup's request is admitted (so retries count once)."""

    queries: int = 0  # tokens looked up
    hits: int = 0  # of which found in the cache
    requests: int = 0  # requests looked up
    hit_requests: int = 0  # of which found at least one block


@dataclass
class GroupBlocks:
    """One KV group's blocks of every request."""

    window: int | None  # keys behind a query the group's layers read (None: all)
    req_blocks: dict[str, list[KVBlock]] = field(default_factory=dict)  # in token order
    num_cached: dict[str, int] = field(default_factory=dict)  # leading blocks named
    num_released: dict[str, int] = field(default_factory=dict)  # leading blocks let go of

    def first_needed(self, num_computed: int, block_size: int) -> int:
        """The first block a query at position `num_computed` (or later) reads."""
        if self.window is None:
            return 0
        return max(num_computed - self.window + 1, 0) // block_size


# A prefix hit: per KV group, the hit's blocks in token order (RELEASED_BLOCK where a
# sliding-window group takes none: behind the window of the first query), all of one length.
PrefixHit = list[list[KVBlock]]


class KVCacheManager:
    """Which blocks each request holds. The scheduler's only door to the block pool."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        prefix_cache: str = "hash",
        eviction: str = "lru",
        windows: Sequence[int | None] = (None,),
    ) -> None:
        """`windows`: per KV group, the window W of its layers (no layer of the group reads
        a key more than W - 1 positions before its query; None: the whole context)."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        cache = make_prefix_cache(prefix_cache, block_size, eviction)  # (checks the name)
        if not enable_caching:
            cache = NoPrefixCache()
        if not windows:
            raise ValueError("a KV pool needs at least one KV group")
        for w in windows:
            if w is not None and w < 1:
                raise ValueError(f"a sliding window must be positive, got {w}")
        if len(windows) > 1 and not cache.allows_released_prefix:
            raise ValueError(
                f"the {cache.kind} prefix cache keeps one KV group, not {len(windows)}"
            )
        self.block_size = block_size
        self.cache = cache
        self.pool = BlockPool(num_blocks, cache)
        # (A cache that keeps a request's blocks as one path from its first cannot have
        # holes in it: with one, every block stays held.)
        if not cache.allows_released_prefix:
            windows = (None,)
        self.groups = [GroupBlocks(w) for w in windows]
        self.stats = PrefixCacheStats()
        self.num_window_releases = 0  # blocks released behind windows, since start

    def describe_windows(self) -> str:
        """The groups' windows, for the engine's ready line ("" with one global group)."""
        windows = [g.window for g in self.groups]
        sliding = sorted({w for w in windows if w is not None})
        if not sliding:
            return ""
        spans = "/".join(str(w) for w in sliding)
        if len(windows) == 1:
            return f"KV released behind a {spans}-token window"
        return (
            f"{len(windows)} KV groups ({windows.count(None)} global, "
            f"{len(windows) - windows.count(None)} released behind {spans}-token windows)"
        )

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    # The first group's lists: the whole story of a model with one group.
    @property
    def req_blocks(self) -> dict[str, list[KVBlock]]:
        return self.groups[0].req_blocks

    @property
    def num_cached_blocks(self) -> dict[str, int]:
        return self.groups[0].num_cached

    @property
    def num_released(self) -> dict[str, int]:
        return self.groups[0].num_released

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (reusable on a hit, evictable)."""
        return self.cache.num_cached_free

    @property
    def num_evictions(self) -> int:
        """Cached blocks reused for other data, since start."""
        return self.cache.num_evictions

    @property
    def block_hasher(self):
        """What computes a request's block hashes, if the cache keys by them (else None)."""
        return self.cache.block_hasher

    def longest_alone(self, chunk_tokens: int, lookahead: int = 0) -> int | None:
        """The longest sequence (tokens) one request can hold alone in the pool, scheduled
        `chunk_tokens` at a time with `lookahead` slots past them; None: any length (every
        group slides, a window and a chunk fit, and the blocks behind them are released)."""
        bs, num_blocks = self.block_size, self.pool.num_blocks
        # The most a sliding group holds at once: the first query's window, the chunk and
        # its lookahead.
        peaks = [
            None if g.window is None else -(-(g.window - 1 + chunk_tokens + lookahead) // bs) + 1
            for g in self.groups
        ]

        def blocks_for(tokens: int) -> int:
            n = -(-(tokens + lookahead) // bs)
            return sum(n if peak is None else min(n, peak) for peak in peaks)

        if None not in peaks and sum(peaks) <= num_blocks:
            return None
        lo, hi = 0, num_blocks * bs  # the longest with blocks_for(tokens) <= num_blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if blocks_for(mid) <= num_blocks else (lo, mid - 1)
        return lo

    def get_computed_blocks(self, request: Request) -> tuple[PrefixHit, int]:
        """The longest cached prefix of a request: (its blocks per group, tokens they hold).

        The last token is always left to compute, since its logits are needed. A request
        that wants prompt logprobs needs the logits of every prompt position, so it takes
        no hits (it still fills the cache for others).
        """
        return self._find_prefix(request, touch=True)

    def cached_prefix_len(self, request: Request) -> int:
        """Tokens of the request's prefix in the cache now, without touching anything."""
        return self._find_prefix(request, touch=False)[1]

    def _find_prefix(self, request: Request, touch: bool) -> tuple[PrefixHit, int]:
        """The longest n such that every group has what its first query at n * block_size
        reads: a global group every block before it, a sliding group those in its window."""
        if not self._may_hit(request):
            return [[] for _ in self.groups], 0
        bs = self.block_size
        n = (request.num_tokens - 1) // bs
        found: list[list[KVBlock | None]] = []
        for i, g in enumerate(self.groups):
            if g.window is None:
                blocks = self.cache.match(request, n, touch, i)
                n = len(blocks)
                found.append(list(blocks))
            else:
                found.append(self.cache.find(request, n, i))
        # Shrink n until every sliding group has its window's blocks: a smaller n can need
        # blocks a larger one did not, so go round until nothing changes.
        changed = True
        while changed and n:
            changed = False
            for g, blocks in zip(self.groups, found):
                k = n
                while k:
                    first = g.first_needed(k * bs, bs)
                    gaps = [j for j in range(first, k) if blocks[j] is None]
                    if not gaps:
                        break
                    k = gaps[-1]  # any longer hit would still read the last gap
                changed |= k < n
                n = k
        hits = [
            [RELEASED_BLOCK] * (first := g.first_needed(n * bs, bs)) + blocks[first:n]
            for g, blocks in zip(self.groups, found)
        ]
        return hits, n * bs

    @staticmethod
    def _may_hit(request: Request) -> bool:
        return request.sampling_params.prompt_logprobs is None

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: PrefixHit | tuple[()] = (),
        lookahead: int = 0,
        cache: bool = True,
    ) -> list[list[KVBlock]] | None:
        """Give `request` blocks for its computed tokens plus `num_new_tokens` more, plus
        `lookahead` slots past them (speculative decoding: where a draft model writes the
        K/V of its guesses; never hashed).

        `new_computed_blocks` is a prefix hit (from get_computed_blocks) that the request
        takes now. Returns the newly allocated blocks per group, or None if the pool cannot
        supply them (then nothing changed but the release of blocks the request no longer
        reads, which is due either way). `cache=False`: the new tokens' K/V arrives later
        than this step's forward (a remote prefill): cache_blocks() names them then.
        """
        rid = request.request_id
        bs = self.block_size
        hits = list(new_computed_blocks) or [[] for _ in self.groups]
        held = [g.req_blocks.setdefault(rid, []) for g in self.groups]
        if held[0]:  # what the last step moved past goes first
            for g, blocks in zip(self.groups, held):
                if g.window is not None:
                    self._release_behind_window(g, rid, blocks, request.num_computed_tokens)
        num_hit = len(hits[0])
        total_tokens = request.num_computed_tokens + num_hit * bs + num_new_tokens
        num_needed = -(-(total_tokens + lookahead) // bs) - len(held[0]) - num_hit
        # Hits that sit in the free queue leave it when touched, so they cost free slots too.
        num_revived = sum(
            1
            for group_hits in hits
            for b in group_hits
            if b is not RELEASED_BLOCK and not b.ref_cnt
        )
        if max(num_needed, 0) * len(self.groups) + num_revived > self.pool.num_free_blocks:
            if not held[0]:
                for g in self.groups:
                    del g.req_blocks[rid]
            return None
        # Every group's hits are taken before any group's new blocks: a hit still in the
        # free queue must leave it before get_new_blocks could hand it to another group.
        for g, blocks, group_hits in zip(self.groups, held, hits):
            # (Hits come only to a request that holds nothing yet.)
            skipped = sum(1 for b in group_hits if b is RELEASED_BLOCK)
            self.pool.touch(group_hits[skipped:])
            blocks.extend(group_hits)
            if skipped:  # named already (they are hits): no insert may stamp placeholders
                g.num_released[rid] = skipped
                g.num_cached[rid] = max(g.num_cached.get(rid, 0), num_hit)
        new_blocks = [self.pool.get_new_blocks(max(num_needed, 0)) for _ in self.groups]
        for blocks, group_new in zip(held, new_blocks):
            blocks.extend(group_new)
        if cache:
            self.cache_blocks(request, total_tokens)
        return new_blocks

    def _release_behind_window(
        self, g: GroupBlocks, rid: str, held: list[KVBlock], num_computed: int
    ) -> None:
        """Let go of the leading blocks no query from position `num_computed` on can see:
        keys before num_computed - W + 1. Only blocks the prefix cache has settled (named,
        or nothing to name) go, so a later insert never meets a hole."""
        end = min(g.first_needed(num_computed, self.block_size), g.num_cached.get(rid, 0))
        end = min(end, len(held))
        start = g.num_released.get(rid, 0)
        if end <= start:
            return
        gone = held[start:end]
        held[start:end] = [RELEASED_BLOCK] * (end - start)
        g.num_released[rid] = end
        self.num_window_releases += end - start
        self.pool.free(reversed(gone))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Enter the request's full blocks among its first `num_tokens` tokens in the prefix
        cache (their K/V is, or is being, written)."""
        rid = request.request_id
        for i, g in enumerate(self.groups):
            start = g.num_cached.get(rid, 0)
            blocks = g.req_blocks.get(rid, [])
            g.num_cached[rid] = self.cache.insert(request, blocks, start, num_tokens, i)

    def free(self, request: Request) -> None:
        """Release every block of a request, tail first, so shared trunks outlive leaves."""
        rid = request.request_id
        for g in self.groups:
            blocks = g.req_blocks.pop(rid, [])
            g.num_cached.pop(rid, None)
            released = g.num_released.pop(rid, 0)
            self.pool.free(reversed(blocks[released:]))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The first group's block ids (a model with one group: all of them)."""
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        """Block ids per group."""
        return [[b.block_id for b in g.req_blocks.get(request_id, [])] for g in self.groups]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        held: dict[tuple[str, int], list[KVBlock]] = {}
        owner: dict[int, tuple[str, int]] = {}  # block id -> a (request, group) holding it
        for i, g in enumerate(self.groups):
            for rid, blocks in g.req_blocks.items():
                released = g.num_released.get(rid, 0)
                assert all(b is RELEASED_BLOCK for b in blocks[:released]), rid
                assert all(b is not RELEASED_BLOCK for b in blocks[released:]), rid
                assert len(blocks) == len(self.req_blocks[rid]), (rid, i)
                held[rid, i] = blocks[released:]
                for b in held[rid, i]:  # a block holds one group's layers' K/V
                    other = owner.setdefault(b.block_id, (rid, i))
                    assert other[1] == i, f"{b} is in group {other[1]} and group {i}"
        self.pool.check_integrity(held)
