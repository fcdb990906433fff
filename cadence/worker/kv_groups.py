"""KV groups: which attention layers share a block list, and how they share the pool's memory.

A model whose layers read K/V over different spans (Gemma 2 alternates 4,096-token local
windows with global layers; Gemma 3 and Cohere2 put one global layer after every few local
ones) would waste most of a long sequence's memory if every layer kept every block: the
local layers need only their window. So layers are grouped by window, and a request holds
one block list per group (core/kv_cache.py), each group releasing what falls behind its
window.

Memory is shared the way the block ids are: every group has the same number of layers,
`num_slots`, and slot s of every group is one [2, num_blocks, ...] tensor. A block id is
held by one group at a time, so a block costs num_slots layers' K/V whichever group holds
it, and one pool serves all groups with no split fixed in advance. A kind of layer whose
count is not a multiple of the group size gets a last, short group (its missing slots are
memory no layer uses); the group size is chosen to keep that padding within
MAX_PADDING of the layers.

One group (every layer alike) is the plain layout: slot i is layer i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cadence.config import EngineConfig
from cadence.core.kv_cache import prefix_cache_allows_holes

MAX_PADDING = 0.1  # of the layers: slots a grouping may leave unused


@dataclass(frozen=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: its layers' window (None: everything)
    layers: tuple[tuple[int, ...], ...]  # per group: its layers (attention-layer indices)

    @property
    def num_slots(self) -> int:
        """K/V tensors: the largest group's layers."""
        return max(len(layers) for layers in self.layers)

    @property
    def num_groups(self) -> int:
        return len(self.windows)


def plan_kv_groups(windows: Sequence[int | None], split: bool = True) -> KVGroups:
    """Group attention layers by their window (`windows[i]`: layer i's). `split` False
    keeps one group: every block held by every layer, windowed by the widest window only
    where every layer slides (a prefix cache that allows no holes, disaggregation, a
    draft model's K/V in the same blocks)."""
    all_layers = tuple(range(len(windows)))
    kinds = sorted(set(windows), key=lambda w: (w is not None, -(w or 0)))  # global first
    if len(kinds) <= 1 or not split:
        widest = None if None in kinds or not kinds else max(kinds)
        return KVGroups((widest,), (all_layers,))
    by_kind = [[i for i, w in enumerate(windows) if w == kind] for kind in kinds]
    size = _group_size([len(layers) for layers in by_kind], len(windows))
    group_windows, group_layers = [], []
    for kind, layers in zip(kinds, by_kind):
        for start in range(0, len(layers), size):
            group_windows.append(kind)
            group_layers.append(tuple(layers[start : start + size]))
    return KVGroups(tuple(group_windows), tuple(group_layers))


def _group_size(counts: list[int], num_layers: int) -> int:
    """The largest group size (at most the smallest kind's count) whose padding stays
    within MAX_PADDING of the layers; 1 always does."""
    for size in range(min(counts), 0, -1):
        slots = sum(-(-c // size) * size for c in counts)
        if slots - num_layers <= MAX_PADDING * num_layers:
            return size
    return 1


def runner_kv_groups(layers: list, config: EngineConfig, drafter=None) -> KVGroups:
    """The target model's groups: by window, unless every block must stay held by every
    layer. Disaggregation moves whole prompts, and a drafter that keeps K/V of its own in
    the same blocks reads the whole context: one group, nothing released. A prefix cache
    that allows no holes, or layers of different K/V shapes (a slot has one shape): one
    group, released behind a window only where every layer slides."""
    windows = [a.window for a in layers]
    if config.kv_role or (drafter is not None and drafter.kv_bytes_per_block()):
        return plan_kv_groups([None] * len(windows))
    cc = config.cache
    split = prefix_cache_allows_holes(cc.prefix_cache, cc.enable_prefix_caching) and (
        len({(a.num_kv_heads, a.head_dim) for a in layers}) <= 1
    )
    return plan_kv_groups(windows, split)
