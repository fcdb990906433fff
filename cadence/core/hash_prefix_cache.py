"""vLLM's bet: the prefix cache as a map from chained block hashes to blocks.

Block hashes chain: hash(block i) = sha256(hash(block i-1) || token ids of block i || extra),
so one hash names a whole prefix, and equal hashes mean equal prefixes. A block that
holds an image's placeholder tokens hashes the image's content hash in its extra: the same
placeholders before another image are another prefix. A request of a
LoRA adapter chains from its adapter's own root instead of NONE_HASH: adapters' K/V
differ, so their prefixes never meet (nor the base model's). A request's hashes
are computed as its tokens arrive (`Request.block_hashes`, by `make_block_hasher`).

A freed block stays in the pool's free queue and keeps its hash: a hit revives it, and
reusing it for other data (the free queue's head first, so least recently freed first)
evicts it. One block per hash: a second block computing the same prefix stays private.
KV groups key apart: group g > 0 files a block under its hash with the byte g appended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from cadence.core.block import KVBlock
from cadence.core.prefix_cache import PrefixCache
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


def group_key(block_hash: bytes, group: int) -> bytes:
    """What KV group `group` (0-255) files a block of this prefix under."""
    return block_hash if group == 0 else block_hash + bytes((group,))


def root_of(request: Request) -> bytes | None:
    """What a request's first block chains from (None: NONE_HASH, the base model's)."""
    if request.lora is None:
        return None
    return hashlib.sha256(request.lora.cache_namespace).digest()


def make_block_hasher(block_size: int, extra: bytes = b""):
    """Returns f(request) -> hashes of the request's full blocks not yet hashed."""

    def hasher(request: Request) -> list[bytes]:
        done = len(request.block_hashes)
        parent = request.block_hashes[-1] if done else root_of(request)
        new: list[bytes] = []
        start = done * block_size
        tokens = request.all_token_ids
        while start + block_size <= len(tokens):
            end = start + block_size
            seen = images_in(request, start, end) if request.images else b""
            parent = hash_block_tokens(parent, tokens[start:end], extra + seen)
            new.append(parent)
            start = end
        return new

    return hasher


def images_in(request: Request, start: int, end: int) -> bytes:
    """The content hashes of the request's images whose placeholders overlap positions
    [start, end): a block's tokens alone cannot tell one image from another."""
    return b"".join(
        bytes.fromhex(image.content_hash)
        for image in request.images
        if image.offset < end and image.end > start
    )


class HashPrefixCache(PrefixCache):
    kind = "hash"

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.block_hasher = make_block_hasher(block_size)
        self.cached: dict[bytes, KVBlock] = {}
        self._num_evictions = 0
        self._num_cached_free = 0  # blocks in the free queue that keep a hash

    num_evictable = 0  # its free blocks all sit in the pool's free queue

    @property
    def num_cached_free(self) -> int:
        return self._num_cached_free

    @property
    def num_evictions(self) -> int:
        return self._num_evictions

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def match(
        self, request: Request, max_blocks: int, touch: bool = True, group: int = 0
    ) -> list[KVBlock]:
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.cached.get(group_key(block_hash, group))
            if block is None:
                break
            hits.append(block)
        return hits

    def find(self, request: Request, max_blocks: int, group: int) -> list[KVBlock | None]:
        # A chained hash names its whole prefix: block i alone is a hit even where an
        # earlier block was evicted.
        get = self.cached.get
        return [get(group_key(h, group)) for h in request.block_hashes[:max_blocks]]

    def insert(
        self,
        request: Request,
        blocks: Sequence[KVBlock],
        start: int,
        num_tokens: int,
        group: int = 0,
    ) -> int:
        # Blocks whose tokens are all known get their hash now. Their K/V is written by this
        # step's forward before any attention reads it, so a hit in the same step (a
        # sibling sample, say) is safe.
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        for i in range(start, num_full):
            self.cache_block(blocks[i], group_key(request.block_hashes[i], group))
        return max(start, num_full)

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        if block.block_hash is not None:
            return  # already names its prefix (a hit, or cached earlier)
        if block_hash in self.cached:
            return  # another block already holds this prefix; this one stays private
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def on_reference(self, block: KVBlock) -> bool:
        self._num_cached_free -= block.block_hash is not None
        return False

    def on_release(self, block: KVBlock) -> bool:
        self._num_cached_free += block.block_hash is not None
        return False

    def on_reuse(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            self._num_evictions += 1
            self._num_cached_free -= 1

    def reset(self) -> list[KVBlock]:
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        self._num_cached_free = 0
        return []

    def check_integrity(self, blocks: list[KVBlock], in_queue: set[int]) -> None:
        hashed = sum(blocks[i].block_hash is not None for i in in_queue)
        assert hashed == self._num_cached_free, (hashed, self._num_cached_free)
        for h, b in self.cached.items():
            assert b.block_hash == h, f"cache maps a hash to {b}, which holds another"
