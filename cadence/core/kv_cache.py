"""Which blocks each request holds: the scheduler's one door to the block pool.

    KVCacheManager
      pool            BlockPool (block_pool.py): blocks, reference counts, the free queue
      pool.cache      PrefixCache (prefix_cache.py): hash | radix | none, picked here
      req_blocks      request id -> its blocks, in token order

The manager never asks which prefix cache it has: `get_computed_blocks` asks the cache for a
request's longest cached prefix, `cache_blocks` tells it which full blocks now hold K/V.

Sliding windows: when every attention layer sees only its last W keys, a request's blocks
wholly behind the window of its next query token are released as it moves on (its list
keeps RELEASED_BLOCK in their place, so positions still index blocks). They go back to the
pool as a finished request's do: still cached, reusable on a hit until evicted; prefix hits
behind the window are never taken. A long sequence then holds about W / block_size + 1
blocks, not one per block of its context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass
class PrefixCacheStats:
    """Counted by the scheduler when a lookup's request is admitted (so retries count once)."""

    queries: int = 0  # tokens looked up
    hits: int = 0  # of which found in the cache
    requests: int = 0  # requests looked up
    hit_requests: int = 0  # of which found at least one block


class KVCacheManager:
    """Which blocks each request holds. The scheduler's only door to the block pool."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        prefix_cache: str = "hash",
        eviction: str = "lru",
        sliding_window: int | None = None,
    ) -> None:
        """`sliding_window` W: no attention layer reads a key more than W - 1 positions
        before its query (None: some layer reads the whole context)."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        cache = make_prefix_cache(prefix_cache, block_size, eviction)  # (checks the name)
        if not enable_caching:
            cache = NoPrefixCache()
        self.block_size = block_size
        self.cache = cache
        self.pool = BlockPool(num_blocks, cache)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks already in the cache
        self.stats = PrefixCacheStats()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        # (A cache that keeps a request's blocks as one path from its first cannot have
        # holes in it: with one, every block stays held.)
        self.window = sliding_window if cache.allows_released_prefix else None
        self.num_released: dict[str, int] = {}  # leading blocks a request let go of
        self.num_window_releases = 0  # blocks released behind windows, since start

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
        `chunk_tokens` at a time with `lookahead` slots past them; None: any length (a
        window and a chunk fit, and the blocks behind the window are released)."""
        num_blocks = self.pool.num_blocks
        if self.window is not None:
            # At most: the blocks of the first query's window, the chunk and its lookahead.
            peak = -(-(self.window - 1 + chunk_tokens + lookahead) // self.block_size) + 1
            if peak <= num_blocks:
                return None
        return num_blocks * self.block_size - lookahead

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of a request: (blocks, number of tokens they hold).

        The last token is always left to compute, since its logits are needed. A request
        that wants prompt logprobs needs the logits of every prompt position, so it takes
        no hits (it still fills the cache for others).
        """
        if not self._may_hit(request):
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits = self.cache.match(request, max_hit_blocks)
        return hits, len(hits) * self.block_size

    def cached_prefix_len(self, request: Request) -> int:
        """Tokens of the request's prefix in the cache now, without touching anything."""
        if not self._may_hit(request):
            return 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        return len(self.cache.match(request, max_hit_blocks, touch=False)) * self.block_size

    @staticmethod
    def _may_hit(request: Request) -> bool:
        return request.sampling_params.prompt_logprobs is None

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        lookahead: int = 0,
        cache: bool = True,
    ) -> list[KVBlock] | None:
        """Give `request` blocks for its computed tokens plus `num_new_tokens` more, plus
        `lookahead` slots past them (speculative decoding: where a draft model writes the
        K/V of its guesses; never hashed).

        `new_computed_blocks` are prefix-cache hits (from get_computed_blocks) that the
        request takes now. Returns the newly allocated blocks, or None (and changes nothing)
        if the pool cannot supply them. `cache=False`: the new tokens' K/V arrives later
        than this step's forward (a remote prefill): cache_blocks() names them then.
        """
        rid = request.request_id
        held = self.req_blocks.setdefault(rid, [])
        if self.window is not None and held:  # what the last step moved past goes first
            self._release_behind_window(rid, held, request.num_computed_tokens)
        hits = list(new_computed_blocks)
        num_computed = request.num_computed_tokens + len(hits) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_needed = -(-(total_tokens + lookahead) // self.block_size) - len(held) - len(hits)
        # Hits behind the window are never taken (a prefix longer than the pool must still
        # fit): the request starts with them released. (Hits come only to a request that
        # holds nothing yet.)
        skipped = 0
        if self.window is not None and not held:
            behind = (num_computed - self.window + 1) // self.block_size
            skipped = min(max(behind, 0), len(hits))
        kept = hits[skipped:]
        # Hits that sit in the free queue leave it when touched, so they cost free slots too.
        num_revived = sum(1 for b in kept if b.ref_cnt == 0)
        if num_needed + num_revived > self.pool.num_free_blocks:
            if not held:
                del self.req_blocks[rid]
            return None
        self.pool.touch(kept)
        held.extend([RELEASED_BLOCK] * skipped + kept)
        if skipped:  # named already (they are hits): no insert may stamp the placeholders
            self.num_released[rid] = skipped
            self.num_cached_blocks[rid] = max(self.num_cached_blocks.get(rid, 0), len(hits))
        new_blocks = self.pool.get_new_blocks(max(num_needed, 0))
        held.extend(new_blocks)
        if cache:
            self.cache_blocks(request, total_tokens)
        return new_blocks

    def _release_behind_window(self, rid: str, held: list[KVBlock], num_computed: int) -> None:
        """Let go of the leading blocks no query from position `num_computed` on can see:
        keys before num_computed - W + 1. Only blocks the prefix cache has settled (named,
        or nothing to name) go, so a later insert never meets a hole."""
        behind = (num_computed - self.window + 1) // self.block_size
        end = min(behind, self.num_cached_blocks.get(rid, 0), len(held))
        start = self.num_released.get(rid, 0)
        if end <= start:
            return
        gone = held[start:end]
        held[start:end] = [RELEASED_BLOCK] * (end - start)
        self.num_released[rid] = end
        self.num_window_releases += end - start
        self.pool.free(reversed(gone))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Enter the request's full blocks among its first `num_tokens` tokens in the prefix
        cache (their K/V is, or is being, written)."""
        rid = request.request_id
        start = self.num_cached_blocks.get(rid, 0)
        named = self.cache.insert(request, self.req_blocks.get(rid, []), start, num_tokens)
        self.num_cached_blocks[rid] = named

    def free(self, request: Request) -> None:
        """Release every block of a request, tail first, so shared trunks outlive leaves."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        released = self.num_released.pop(request.request_id, 0)
        self.pool.free(reversed(blocks[released:]))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        held = {}
        for rid, blocks in self.req_blocks.items():
            released = self.num_released.get(rid, 0)
            assert all(b is RELEASED_BLOCK for b in blocks[:released]), rid
            assert all(b is not RELEASED_BLOCK for b in blocks[released:]), rid
            held[rid] = blocks[released:]
        self.pool.check_integrity(held)
