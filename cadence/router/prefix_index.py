"""What the router sent to each replica, as an approximate prefix tree of token ids.

The tree is kept as chained chunk hashes: a chunk is CHUNK_TOKENS token ids, and its key
hashes its parent's key with its tokens, so one key names a whole prefix (the same idea as
the engine's block hashes). A replica's index maps keys to nothing, in LRU order, and holds
at most `max_chunks` of them (the oldest go first): bounded memory, and a prefix the
replica has long evicted from its own cache is forgotten here too, eventually.

It is approximate on purpose: the router tokenizes on its own (chat messages are rendered
plainly, not through the model's template), and it does not see the replica's evictions.
A match says "this replica was sent this prefix recently", which is what routing needs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

CHUNK_TOKENS = 16


def chunk_keys(token_ids: list[int], chunk: int = CHUNK_TOKENS) -> list[bytes]:
    """Chained keys of every full chunk of `token_ids`."""
    keys, parent = [], b""
    for start in range(0, len(token_ids) - chunk + 1, chunk):
        data = parent + b"".join(t.to_bytes(4, "little") for t in token_ids[start : start + chunk])
        parent = hashlib.blake2b(data, digest_size=16).digest()
        keys.append(parent)
    return keys


class PrefixIndex:
    """One replica's recent prefixes (in chunks of CHUNK_TOKENS tokens)."""

    def __init__(self, max_chunks: int = 1 << 16) -> None:
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be positive, got {max_chunks}")
        self.max_chunks = max_chunks
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, keys: list[bytes]) -> int:
        """How many leading chunks of `keys` this replica was sent (no LRU update)."""
        n = 0
        for key in keys:
            if key not in self._lru:
                break
            n += 1
        return n

    def insert(self, keys: list[bytes]) -> None:
        """Record a prefix sent: its chunks become the most recently used."""
        lru = self._lru
        # Deepest chunk first: a parent ends up more recent than its children, so the LRU
        # end drops leaves before the trunk they hang from (a chain stays matchable).
        for key in reversed(keys):
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
        while len(lru) > self.max_chunks:
            lru.popitem(last=False)

    def remove_all(self) -> None:
        self._lru.clear()
