"""All KV-cache accounting: the block pool, the prefix cache and the per-request manager.

Pure Python over plain numbers; no tensors. The worker owns the memory, this module owns
which block holds what.

    BlockPool
      blocks[i]          one KVBlock per physical block, id == index
      free queue         doubly linked, LRU at the head; a freed block joins at the tail
                         and keeps its hash, so it can still be hit until it is reused
      cached             block hash -> block (full blocks only; one block per hash)

    A block is in exactly one of three states:
      held      ref_cnt > 0, not in the free queue (may also be cached)
      cached    ref_cnt == 0, in the free queue, has a hash (a prefix-cache hit revives it)
      free      ref_cnt == 0, in the free queue, no hash

    With the radix cache (`prefix_cache="radix"`, cadence/core/radix_cache.py) the hash map
    is replaced by a tree, and an unreferenced block in the tree stays *out* of the free
    queue: the tree evicts it (LRU leaf first) when the queue runs short. Free blocks are
    then the free queue plus the tree's unreferenced blocks.

Block hashes chain: hash(block i) = sha256(hash(block i-1) || token ids of block i || extra),
so one hash names a whole prefix, and equal hashes mean equal prefixes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cadence.core.radix_cache import RadixTree
from cadence.core.request import Request

NONE_HASH = b"\x00" * 32


def hash_block_tokens(
    parent_hash: bytes | None, token_ids: Sequence[int], extra: bytes = b""
) -> bytes:
    """A stable (process-independent) hash of a full block and everything before it."""
    h = hashlib.sha256(parent_hash or NONE_HASH)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    if extra:
        h.update(extra)
    return h.digest()


def make_block_hasher(block_size: int, extra: bytes = b""):
    """Returns f(request) -> hashes of the request's full blocks not yet hashed."""

    def hasher(request: Request) -> list[bytes]:
        done = len(request.block_hashes)
        parent = request.block_hashes[-1] if done else None
        new: list[bytes] = []
        start = done * block_size
        tokens = request.all_token_ids
        while start + block_size <= len(tokens):
            parent = hash_block_tokens(parent, tokens[start : start + block_size], extra)
            new.append(parent)
            start += block_size
        return new

    return hasher


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "node", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.node = None  # the radix-tree node holding this block, if any
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) pop-left, append and remove-from-middle.

    Head = least recently freed = next to be reused (and so evicted from the prefix cache).
    """

    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(-1)  # sentinels: no None checks in the hot paths
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, block
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def __iter__(self):
        b = self._head.next_free
        while b is not None and b is not self._tail:
            yield b
            b = b.next_free

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        block_size: int = 16,
        radix: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}
        self._num_hash_evictions = 0
        self._num_cached_free = 0  # hash mode: blocks in the free queue that keep a hash
        self.tree: RadixTree | None = None
        if enable_caching and radix:
            self.tree = RadixTree(block_size, self.free_queue.append)

    @property
    def num_free_blocks(self) -> int:
        evictable = self.tree.num_evictable if self.tree is not None else 0
        return self.free_queue.num_free + evictable

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (reusable on a hit, evictable)."""
        return self.tree.num_evictable if self.tree is not None else self._num_cached_free

    @property
    def num_evictions(self) -> int:
        """Cached blocks reused for other data, since start."""
        return self.tree.num_evictions if self.tree is not None else self._num_hash_evictions

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        if self.tree is not None and n > self.free_queue.num_free:
            self.tree.evict(n - self.free_queue.num_free)
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            self._num_hash_evictions += 1
            self._num_cached_free -= 1

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cache hits, reviving any that sat in the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                if block.node is not None:
                    self.tree.num_evictable -= 1  # in the tree, not the queue
                else:
                    self.free_queue.remove(block)
                    self._num_cached_free -= block.block_hash is not None
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop a reference; blocks that reach zero join the free queue's tail in this order."""
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0:
                if block.node is not None:
                    self.tree.num_evictable += 1  # stays in the tree until evicted
                else:
                    self.free_queue.append(block)
                    self._num_cached_free += block.block_hash is not None

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        if block.block_hash is not None:
            return  # already names its prefix (a hit, or cached earlier)
        if block_hash in self.cached:
            return  # another block already holds this prefix; this one stays private
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only possible when no request holds a block."""
        if self.num_free_blocks != self.num_blocks:
            return False
        if self.tree is not None:
            self.tree.evict(self.num_blocks)
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        self._num_cached_free = 0
        return True

    def check_integrity(self, held: dict[str, list[KVBlock]]) -> None:
        """Raise AssertionError if the accounting is inconsistent. `held`: req id -> blocks."""
        in_queue = set()
        for b in self.free_queue:
            assert b.ref_cnt == 0, f"{b} is in the free queue with references"
            assert b.block_id not in in_queue, f"{b} is in the free queue twice"
            in_queue.add(b.block_id)
        assert len(in_queue) == self.free_queue.num_free
        if self.tree is None:
            hashed = sum(self.blocks[i].block_hash is not None for i in in_queue)
            assert hashed == self._num_cached_free, (hashed, self._num_cached_free)
        if self.tree is not None:
            self.tree.check_integrity()
        refs = [0] * self.num_blocks
        for blocks in held.values():
            for b in blocks:
                refs[b.block_id] += 1
        for b in self.blocks:
            assert b.ref_cnt == refs[b.block_id], f"{b}: {refs[b.block_id]} holders"
            free = b.block_id in in_queue or (b.node is not None and b.ref_cnt == 0)
            assert (b.ref_cnt == 0) == free, f"{b} neither held nor free"
            assert not (b.node is not None and b.block_id in in_queue), f"{b} in tree and queue"
        for h, b in self.cached.items():
            assert b.block_hash == h, f"cache maps a hash to {b}, which holds another"


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
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if prefix_cache not in ("hash", "radix"):
            raise ValueError(f"prefix_cache must be 'hash' or 'radix', got {prefix_cache!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.prefix_cache = prefix_cache if enable_caching else "none"
        self.pool = BlockPool(num_blocks, enable_caching, block_size, radix=prefix_cache == "radix")
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks already in the cache
        self.stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return self.pool.num_cached_free_blocks

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of a request: (blocks, number of tokens they hold).

        The last token is always left to compute, since its logits are needed. A request
        that wants prompt logprobs needs the logits of every prompt position, so it takes
        no hits (it still fills the cache for others).
        """
        if not self._may_hit(request):
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        if self.pool.tree is not None:
            hits = self.pool.tree.match(request.all_token_ids, max_hit_blocks)
            return hits, len(hits) * self.block_size
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def cached_prefix_len(self, request: Request) -> int:
        """Tokens of the request's prefix in the cache now, without touching anything."""
        if not self._may_hit(request):
            return 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        if self.pool.tree is not None:
            return (
                len(self.pool.tree.match(request.all_token_ids, max_hit_blocks, touch=False))
                * self.block_size
            )
        n = 0
        for block_hash in request.block_hashes[:max_hit_blocks]:
            if self.pool.lookup(block_hash) is None:
                break
            n += 1
        return n * self.block_size

    def _may_hit(self, request: Request) -> bool:
        return self.enable_caching and request.sampling_params.prompt_logprobs is None

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
        held = self.req_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_needed = (
            -(-(total_tokens + lookahead) // self.block_size) - len(held) - len(new_computed_blocks)
        )
        # Hits that sit in the free queue leave it when touched, so they cost free slots too.
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed + num_revived > self.pool.num_free_blocks:
            if not held:
                del self.req_blocks[request.request_id]
            return None
        self.pool.touch(new_computed_blocks)
        held.extend(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(max(num_needed, 0))
        held.extend(new_blocks)
        if cache:
            self.cache_blocks(request, total_tokens)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Enter the request's full blocks among its first `num_tokens` tokens in the prefix
        cache (their K/V is, or is being, written)."""
        held = self.req_blocks.get(request.request_id, [])
        total_tokens = num_tokens
        if self.pool.tree is not None:
            num_full = min(total_tokens, request.num_tokens) // self.block_size
            if num_full > self.num_cached_blocks.get(request.request_id, 0):
                self.pool.tree.insert(request.all_token_ids, held, num_full)
                self.num_cached_blocks[request.request_id] = num_full
        elif self.enable_caching:
            # Blocks whose tokens are all known get their hash now. Their K/V is written by
            # this step's forward before any attention reads it, so a hit in the same step
            # (a sibling sample, say) is safe.
            num_full = min(total_tokens // self.block_size, len(request.block_hashes))
            start = self.num_cached_blocks.get(request.request_id, 0)
            for i in range(start, num_full):
                self.pool.cache_block(held[i], request.block_hashes[i])
            self.num_cached_blocks[request.request_id] = max(start, num_full)

    def free(self, request: Request) -> None:
        """Release every block of a request, tail first, so shared trunks outlive leaves."""
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.pool.free(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        self.pool.check_integrity(self.req_blocks)
