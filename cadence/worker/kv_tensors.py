"""The K/V tensors of a model's attention layers: their size per pool block, and their
allocation (one [2, num_blocks, block_size, kv_heads, head_dim] tensor per KV slot, bound
to each layer of the slot as `kv_cache`). Without KV groups a slot is a layer; with them
(worker/kv_groups.py) slot s holds layer s of every group. The target model and a draft
model each hold their own, indexed by the same block ids.

A layer whose K and V are one tensor (`kv_shared`: DeepSeek's latent, models/mla.py) gets
a [1, num_blocks, ...] tensor, bound as a [2, ...] view of it whose halves are the same
memory: the backends see the usual layout, and the pool pays for one half."""

from __future__ import annotations

import torch

from cadence.worker.kv_groups import KVGroups, plan_kv_groups


def _slots(model, groups: KVGroups | None) -> list[list]:
    """Per slot, the layers that share it."""
    layers = model.attention_layers()
    if groups is None:
        groups = plan_kv_groups([None] * len(layers))
    slots: list[list] = [[] for _ in range(groups.num_slots)]
    for members in groups.layers:
        for slot, index in enumerate(members):
            slots[slot].append(layers[index])
    return slots


def _halves(layer) -> int:
    """K and V apart (2), or one shared tensor (1)."""
    return 1 if getattr(layer, "kv_shared", False) else 2


def _layer_bytes(layer, block_size: int, dtype: torch.dtype) -> int:
    elements = _halves(layer) * block_size * layer.num_kv_heads * layer.head_dim
    return elements * (torch.finfo(dtype).bits // 8)


def kv_bytes_per_block(
    model, block_size: int, dtype: torch.dtype, groups: KVGroups | None = None
) -> int:
    return sum(
        max(_layer_bytes(layer, block_size, dtype) for layer in shared)
        for shared in _slots(model, groups)
    )


def bind_kv_caches(
    model,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    groups: KVGroups | None = None,
) -> list[torch.Tensor]:
    layers = model.attention_layers()
    if groups is not None:
        for g, members in enumerate(groups.layers):
            for index in members:
                layers[index].kv_group = g
    caches = []
    for shared in _slots(model, groups):
        first = shared[0]
        if any(
            (a.num_kv_heads, a.head_dim, _halves(a))
            != (first.num_kv_heads, first.head_dim, _halves(first))
            for a in shared
        ):
            raise ValueError("layers that share a KV slot must have one K/V shape")
        shape = (_halves(first), num_blocks, block_size, first.num_kv_heads, first.head_dim)
        # Uninitialised (fast to allocate), except block 0: padded key slots point at
        # slot 0, and masked garbage could still be NaN, which survives 0 * NaN.
        cache = torch.empty(shape, dtype=dtype, device=device)
        if cache.device.type == "cpu":
            # Fault every page in now. torch.empty's pages become resident only when a
            # block is first written, so RSS would creep towards the pool's size over
            # hours of serving (the LRU free queue rotates through every block), and a
            # machine short of memory would fail then rather than at start-up.
            cache.zero_()
        else:
            cache[:, 0].zero_()
        view = cache if shape[0] == 2 else cache.expand(2, *shape[1:])  # (both halves: it)
        for layer in shared:
            layer.kv_cache = view
        caches.append(cache)
    return caches
