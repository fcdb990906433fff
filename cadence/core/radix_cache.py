"""SGLang's bet: a radix tree of every prefix computed, evicted leaf first, LRU.

Edges are token sequences, nodes hold the KV blocks for them. A new request walks down as
far as it matches and reuses those blocks; a request's newly computed full blocks are
inserted, splitting an edge where its tokens diverge mid-edge.

    root
     └─ [sys prompt: blocks 4 7 9]            one node, three blocks (an edge of 3*bs tokens)
         ├─ [question A: blocks 12]
         └─ [question B: blocks 3 5]          split from A's edge at the divergence

Matching is block-granular, a deliberate choice: KV lives in fixed-size blocks, and sharing
a partly matching block would mean copying its matching part into a fresh block on every
divergence (a device copy per request) to save at most block_size - 1 tokens of prefill.
So edge lengths are multiples of block_size and a child is keyed by its first block's tokens.

Eviction and locking: a block with references (some running request uses it) is never
evicted; since a request holds every block of its prefix, a referenced block's ancestors are
referenced too, so the unreferenced blocks of the tree are exactly the tails of subtrees.
`evict(n)` takes leaves in the eviction policy's order (least recently used first, or
least frequently used) and frees their blocks from the tail up, so shared trunks outlive
their branches. Unreferenced tree blocks stay out of the pool's free queue; the pool counts
them as free (`num_evictable`) and asks the cache for them when its free queue runs short.

`RadixPrefixCache` is the tree behind the pool's `PrefixCache` interface.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

from cadence.core.block import KVBlock
from cadence.core.prefix_cache import PrefixCache
from cadence.core.request import Request


class RadixNode:
    __slots__ = ("edge", "tokens", "blocks", "children", "parent", "last_access", "hits")

    def __init__(
        self, tokens: tuple[int, ...], blocks: list[KVBlock], parent: RadixNode | None, edge: tuple
    ) -> None:
        self.tokens = tokens  # this edge's tokens, len(blocks) * block_size of them
        self.blocks = blocks
        self.children: dict[tuple[int, ...], RadixNode] = {}  # keyed by a child's first block
        self.parent = parent
        self.edge = edge  # our key in parent.children
        self.last_access = 0  # the tree's clock at its last match or insert
        self.hits = 0  # matches that reached it

    def __repr__(self) -> str:
        return (
            f"RadixNode(blocks={[b.block_id for b in self.blocks]}, children={len(self.children)})"
        )


def tree_tokens(request: Request) -> Sequence[int]:
    """A request's tokens as the tree keys them: its own ids, but an image's placeholders,
    which become negative keys made of the image's content hash and the position in it (the
    same placeholder ids before another image hold other K/V). (LoRA adapters do not run
    with this cache: config.py refuses the pair.)"""
    if not request.images:
        return request.all_token_ids
    keys = list(request.all_token_ids)
    for image in request.images:
        base = int(image.content_hash[:15], 16) << 24
        keys[image.offset : image.end] = [-(base + i) - 1 for i in range(image.length)]
    return keys


# An eviction policy: a leaf's sort key; the smallest is evicted first.
EvictionPolicy = Callable[[RadixNode], tuple]
EVICTION_POLICIES: dict[str, EvictionPolicy] = {
    "lru": lambda node: (node.last_access,),
    "lfu": lambda node: (node.hits, node.last_access),
}


class RadixTree:
    def __init__(
        self, block_size: int, eviction: EvictionPolicy = EVICTION_POLICIES["lru"]
    ) -> None:
        self.block_size = block_size
        self.eviction = eviction
        self.root = RadixNode((), [], None, ())
        self.num_evictable = 0  # tree blocks with no references
        self.num_evictions = 0
        self._clock = itertools.count(1)

    def _key(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(tokens[i * bs : (i + 1) * bs])

    # ---- lookups ----------------------------------------------------------------------

    def match(self, tokens: Sequence[int], max_blocks: int, touch: bool = True) -> list[KVBlock]:
        """Blocks of the longest cached prefix of `tokens`, at most `max_blocks` of them."""
        now = next(self._clock) if touch else 0
        node, i, out = self.root, 0, []
        while i < max_blocks:
            child = node.children.get(self._key(tokens, i))
            if child is None:
                break
            m = self._common_blocks(child, tokens, i, max_blocks)
            out.extend(child.blocks[:m])
            if touch:
                child.last_access = now
                child.hits += 1
            if m < len(child.blocks):
                break
            node, i = child, i + m
        return out

    def _common_blocks(self, node: RadixNode, tokens: Sequence[int], start: int, limit: int) -> int:
        """How many of node's blocks match tokens from block `start` on (the first does)."""
        bs, m = self.block_size, 1
        while m < len(node.blocks) and start + m < limit:
            if (
                tuple(tokens[(start + m) * bs : (start + m + 1) * bs])
                != node.tokens[m * bs : (m + 1) * bs]
            ):
                break
            m += 1
        return m

    # ---- updates ----------------------------------------------------------------------

    def insert(self, tokens: Sequence[int], blocks: Sequence[KVBlock], num_blocks: int) -> None:
        """Record that blocks[:num_blocks] hold the KV of tokens[:num_blocks * block_size].

        Parts already in the tree keep the tree's blocks; a duplicate block of ours stays
        private to its request and returns to the free queue when that request ends.
        """
        now = next(self._clock)
        bs = self.block_size
        node, i = self.root, 0
        while i < num_blocks:
            key = self._key(tokens, i)
            child = node.children.get(key)
            if child is None:
                new_blocks = list(blocks[i:num_blocks])
                if any(b.node is not None for b in new_blocks):
                    return  # a block already in the tree elsewhere: leave this branch out
                leaf = RadixNode(tuple(tokens[i * bs : num_blocks * bs]), new_blocks, node, key)
                leaf.last_access = now
                for b in new_blocks:
                    b.node = leaf
                node.children[key] = leaf
                return
            m = self._common_blocks(child, tokens, i, num_blocks)
            if any(child.blocks[k] is not blocks[i + k] for k in range(m)):
                # Our request computed its own copy of a prefix that is already here; the
                # rest of its blocks hang off its copy, not the tree's, so they stay private
                # (a referenced block must never sit under an unreferenced one).
                return
            if m < len(child.blocks):
                self._split(child, m)
            child.last_access = now
            node, i = child, i + m

    def _split(self, node: RadixNode, m: int) -> None:
        """Cut node's edge after m blocks: node keeps the first m, a new child the rest."""
        bs = self.block_size
        rest = RadixNode(
            node.tokens[m * bs :], node.blocks[m:], node, node.tokens[m * bs : (m + 1) * bs]
        )
        rest.children = node.children
        rest.last_access = node.last_access
        rest.hits = node.hits
        for c in rest.children.values():
            c.parent = rest
        for b in rest.blocks:
            b.node = rest
        node.tokens, node.blocks = node.tokens[: m * bs], node.blocks[:m]
        node.children = {rest.edge: rest}

    def evict(self, num_blocks: int) -> list[KVBlock]:
        """Let go of up to num_blocks unreferenced blocks, leaves first, in the eviction
        policy's order; returns them."""
        key = self.eviction
        heap = [(key(n), id(n), n) for n in self._leaves() if n.blocks[-1].ref_cnt == 0]
        heapq.heapify(heap)
        evicted: list[KVBlock] = []
        while len(evicted) < num_blocks and heap:
            _, _, node = heapq.heappop(heap)
            while node.blocks and node.blocks[-1].ref_cnt == 0 and len(evicted) < num_blocks:
                block = node.blocks.pop()
                node.tokens = node.tokens[: -self.block_size]
                block.node = None
                self.num_evictable -= 1
                self.num_evictions += 1
                evicted.append(block)
            if not node.blocks:
                parent = node.parent
                del parent.children[node.edge]
                if (
                    parent is not self.root
                    and not parent.children
                    and parent.blocks[-1].ref_cnt == 0
                ):
                    heapq.heappush(heap, (key(parent), id(parent), parent))
        return evicted

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                out.append(n)
        return out

    def nodes(self) -> list[RadixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def check_integrity(self) -> None:
        unreferenced = 0
        for n in self.nodes():
            assert n.blocks, f"{n} is empty"
            assert len(n.tokens) == len(n.blocks) * self.block_size, n
            assert n.parent.children.get(n.edge) is n, f"{n} is not under its parent's key"
            assert n.tokens[: self.block_size] == n.edge, n
            for b in n.blocks:
                assert b.node is n, f"{b} points at another node"
            refs = [b.ref_cnt for b in n.blocks]
            assert all(refs[k] == 0 or refs[k - 1] > 0 for k in range(1, len(refs))), (
                f"{n}: a referenced block below an unreferenced one"
            )
            unreferenced += sum(1 for r in refs if r == 0)
        assert unreferenced == self.num_evictable, (unreferenced, self.num_evictable)


class RadixPrefixCache(PrefixCache):
    kind = "radix"
    allows_released_prefix = False  # a request's blocks go in as one path from the root

    def __init__(self, block_size: int, eviction: str = "lru") -> None:
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction policy must be one of {sorted(EVICTION_POLICIES)}")
        self.block_size = block_size
        self.tree = RadixTree(block_size, EVICTION_POLICIES[eviction])

    @property
    def num_evictable(self) -> int:
        return self.tree.num_evictable

    num_cached_free = num_evictable  # its free cached blocks are exactly those it holds

    @property
    def num_evictions(self) -> int:
        return self.tree.num_evictions

    def match(
        self, request: Request, max_blocks: int, touch: bool = True, group: int = 0
    ) -> list[KVBlock]:
        assert group == 0, "the radix cache keeps one KV group (allows_released_prefix)"
        return self.tree.match(tree_tokens(request), max_blocks, touch)

    def insert(
        self,
        request: Request,
        blocks: Sequence[KVBlock],
        start: int,
        num_tokens: int,
        group: int = 0,
    ) -> int:
        assert group == 0, "the radix cache keeps one KV group (allows_released_prefix)"
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        if num_full <= start:
            return start
        self.tree.insert(tree_tokens(request), blocks, num_full)
        return num_full

    def holds(self, block: KVBlock) -> bool:
        return block.node is not None

    def on_reference(self, block: KVBlock) -> bool:
        if block.node is None:
            return False
        self.tree.num_evictable -= 1  # in the tree, not the queue
        return True

    def on_release(self, block: KVBlock) -> bool:
        if block.node is None:
            return False
        self.tree.num_evictable += 1  # stays in the tree until evicted
        return True

    def evict(self, num_blocks: int) -> list[KVBlock]:
        return self.tree.evict(num_blocks)

    def reset(self) -> list[KVBlock]:
        return self.tree.evict(self.tree.num_evictable)

    def check_integrity(self, blocks: list[KVBlock], in_queue: set[int]) -> None:
        self.tree.check_integrity()
