"""A step's token-level inputs from its request-level plan, and their eager metadata.

A step runs, for each request r, the query tokens at positions [starts[r], starts[r] +
query_lens[r]); each token's cache slot comes from its request's block-table row:

    positions  [T]  starts repeated per request, plus 0, 1, 2, ... within it
    slots      [T]  table[row, position // block_size] * block_size + position % block_size

`layout()` computes these vectorised over the whole step (numpy, on the host). The model
runner and the speculative proposers (which run their own small models over the same block
tables) both build their steps with it; `eager_inputs()` turns a layout into the device
tensors and AttentionMetadata of an eager forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from cadence.attention.base import AttentionBackend, AttentionMetadata
from cadence.worker.block_tables import BlockTables
from cadence.worker.transfer import to_device_aligned


@dataclass
class StepLayout:
    rows: np.ndarray  # [R] each request's BlockTables row
    starts: np.ndarray  # [R] its first query position (tokens already with K/V)
    query_lens: np.ndarray  # [R] its query tokens this step
    positions: np.ndarray  # [T]
    slots: np.ndarray  # [T] flat cache slots
    # [T] per KV group after the first, its slots (its tables, the same positions)
    group_slots: list[np.ndarray] = field(default_factory=list)
    # [T] the last key position each token sees, where some see past themselves (images
    # attended both ways: worker/image_feeder.py); None: causal
    key_limits: np.ndarray | None = None

    @property
    def seq_lens(self) -> np.ndarray:
        """[R] tokens with K/V once the step has run."""
        return self.starts + self.query_lens

    @property
    def num_tokens(self) -> int:
        return len(self.positions)


def layout(
    rows: list[int] | np.ndarray,
    starts: list[int] | np.ndarray,
    query_lens: list[int] | np.ndarray,
    tables: BlockTables,
    block_size: int,
    group_tables: Sequence[BlockTables] = (),
) -> StepLayout:
    """`group_tables`: the tables of the KV groups after the first, at the same rows."""
    rows_np = np.asarray(rows, dtype=np.int64)
    starts_np = np.asarray(starts, dtype=np.int64)
    qlens_np = np.asarray(query_lens, dtype=np.int64)
    num_tokens = int(qlens_np.sum())
    if num_tokens == len(rows_np):  # one token each (decodes)
        positions, token_rows = starts_np, rows_np
    else:
        first = np.cumsum(qlens_np) - qlens_np
        positions = np.repeat(starts_np - first, qlens_np) + np.arange(num_tokens)
        token_rows = np.repeat(rows_np, qlens_np)
    index, offset = positions // block_size, positions % block_size
    slots = tables.host[token_rows, index] * block_size + offset
    group_slots = [t.host[token_rows, index] * block_size + offset for t in group_tables]
    return StepLayout(rows_np, starts_np, qlens_np, positions, slots, group_slots)


def eager_inputs(
    lay: StepLayout,
    input_ids: list[int] | np.ndarray,
    tables: BlockTables,
    backend: AttentionBackend,
    device: torch.device,
    block_size: int,
    group_tables: Sequence[BlockTables] = (),
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """(token ids, positions, metadata) on the device: one host-to-device copy of every
    token- and request-level int, then the step's block tables gathered from the
    persistent rows on the device. Call `tables.sync()` first. `group_tables`: as for
    layout(); the metadata then carries a view per KV group."""
    seq_lens = lay.seq_lens
    qsl = np.concatenate([[0], np.cumsum(lay.query_lens)])
    ids_np = np.asarray(input_ids, dtype=np.int64)
    segments = [ids_np, lay.positions, lay.slots, seq_lens, qsl, lay.rows, *lay.group_slots]
    ids_d, pos_d, slots_d, seq_d, qsl_d, rows_d, *group_slots_d = to_device_aligned(
        segments, device
    )
    width = int(tables.num_blocks[lay.rows].max())
    meta = AttentionMetadata(
        num_tokens=lay.num_tokens,
        query_start_loc=qsl_d,
        seq_lens=seq_d,
        slot_mapping=slots_d,
        block_tables=tables.gather(rows_d, width),
        query_lens_cpu=lay.query_lens.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        block_size=block_size,
    )
    if lay.key_limits is not None:
        limits = torch.from_numpy(lay.key_limits)
        meta.key_limits_cpu = limits
        meta.key_limits = limits.to(device, torch.int32, non_blocking=True)
    meta = backend.build(meta)
    if group_tables:  # (every group's rows hold as many entries: one width)
        meta.groups = [meta] + [
            backend.for_group(meta, t.gather(rows_d, width), slots)
            for t, slots in zip(group_tables, group_slots_d)
        ]
    return ids_d, pos_d, meta
