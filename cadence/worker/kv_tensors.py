"""The K/V tensors of a model's attention layers: their size per pool block, and their
allocation (one [2, num_blocks, block_size, kv_heads, head_dim] tensor per layer, bound to
the layer as `kv_cache`). The target model and a draft model each hold their own, indexed
by the same block ids."""

from __future__ import annotations

import torch


def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
    layers = model.attention_layers()
    elem = torch.finfo(dtype).bits // 8
    return sum(2 * block_size * a.num_kv_heads * a.head_dim * elem for a in layers)


def bind_kv_caches(
    model, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    caches = []
    for layer in model.attention_layers():
        shape = (2, num_blocks, block_size, layer.num_kv_heads, layer.head_dim)
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
        layer.kv_cache = cache
        caches.append(cache)
    return caches
