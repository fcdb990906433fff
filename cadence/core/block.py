"""KV blocks and the free queue: the pool's parts (block_pool.py puts them together).

A block is in exactly one of three states:
  held      ref_cnt > 0, not in the free queue (may also be cached)
  cached    ref_cnt == 0, names a prefix, reusable on a hit: in the free queue (hash cache,
            which keeps its hash until the block is reused) or held by the cache outside
            it (radix cache, which evicts it when the queue runs short)
  free      ref_cnt == 0, in the free queue, names no prefix
"""

from __future__ import annotations


class KVBlock:
    """One physical block. `block_hash` (hash cache) and `node` (radix cache) belong to the
    prefix cache that names the block; both stay None without one."""

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


# What a request's block list holds where it let go of a block (its keys are behind its
# group's sliding window). A table sent to the worker after that (a new or resumed
# request) names block 0 there; a running request's table keeps the old id, which may by
# then hold another request's K/V. Either way attention reads no key there unmasked: the
# Triton kernels never load tiles behind the window, and the torch and CPU paths mask them
# over a pool zeroed at start on the CPU (block 0 is zeroed everywhere), so every value a
# masked read meets is finite and adds nothing.
RELEASED_BLOCK = KVBlock(0)
