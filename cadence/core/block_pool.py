"""The KV block pool: physical blocks, their reference counts, the free queue, and the
prefix cache that names some of them.

Pure Python over plain numbers; no tensors. The worker owns the memory, this module owns
which block holds what.

    BlockPool
      blocks[i]          one KVBlock per physical block, id == index
      free queue         doubly linked, LRU at the head; a freed block joins at the tail
      cache              a PrefixCache (prefix_cache.py): which blocks name which prefix

Free blocks are the free queue plus the cache's unreferenced blocks outside it
(`PrefixCache.num_evictable`). The pool never asks which kind of cache it has: it tells the
cache when a block loses or regains its last reference and when one is reused, and asks it
for blocks when the free queue runs short.
"""

from __future__ import annotations

from collections.abc import Iterable

from cadence.core.block import FreeBlockQueue, KVBlock
from cadence.core.prefix_cache import NoPrefixCache, PrefixCache


class BlockPool:
    def __init__(self, num_blocks: int, cache: PrefixCache | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.cache = cache if cache is not None else NoPrefixCache()
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free + self.cache.num_evictable

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        short = n - self.free_queue.num_free
        if short > 0:
            for block in self.cache.evict(short):
                self.free_queue.append(block)
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            self.cache.on_reuse(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cache hits, reviving any that sat among the free blocks."""
        for block in blocks:
            if block.ref_cnt == 0 and not self.cache.on_reference(block):
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop a reference; blocks that reach zero join the free queue's tail in this order
        (unless the cache keeps them)."""
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0 and not self.cache.on_release(block):
                self.free_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only possible when no request holds a block."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.cache.reset():
            self.free_queue.append(block)
        return True

    def check_integrity(self, held: dict[str, list[KVBlock]]) -> None:
        """Raise AssertionError if the accounting is inconsistent. `held`: req id -> blocks."""
        in_queue = set()
        for b in self.free_queue:
            assert b.ref_cnt == 0, f"{b} is in the free queue with references"
            assert b.block_id not in in_queue, f"{b} is in the free queue twice"
            in_queue.add(b.block_id)
        assert len(in_queue) == self.free_queue.num_free
        self.cache.check_integrity(self.blocks, in_queue)
        refs = [0] * self.num_blocks
        for blocks in held.values():
            for b in blocks:
                refs[b.block_id] += 1
        for b in self.blocks:
            assert b.ref_cnt == refs[b.block_id], f"{b}: {refs[b.block_id]} holders"
            free = b.block_id in in_queue or (b.ref_cnt == 0 and self.cache.holds(b))
            assert (b.ref_cnt == 0) == free, f"{b} neither held nor free"
            assert not (self.cache.holds(b) and b.block_id in in_queue), f"{b} in cache and queue"
