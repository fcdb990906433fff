"""The parts of a model runner that its start-up helpers use (warm-up, memory profile):
a structural type, so those helpers need not import the runner that calls them."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from cadence.attention.base import AttentionBackend
from cadence.config import EngineConfig
from cadence.layers.sampler import Sampler
from cadence.worker.drafter import Drafter
from cadence.worker.kv_groups import KVGroups


class RunnerParts(Protocol):
    config: EngineConfig
    device: torch.device
    model: nn.Module
    backend: AttentionBackend
    sampler: Sampler
    drafter: Drafter | None
    block_size: int  # tokens per KV block
    max_model_len: int  # tokens
    vocab_size: int
    num_blocks: int  # the KV pool's blocks (the profile sets it to a trial size)
    max_blocks_per_seq: int  # a block-table row's width
    kv_groups: KVGroups
    kv_caches: list[torch.Tensor]

    def allocate_kv_cache(self, log: bool = True) -> None: ...
