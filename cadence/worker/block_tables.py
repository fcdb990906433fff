"""Every request's block table, one persistent row each, on the host and on the device.

A request keeps its row from the step the runner first sees it until it finishes; rows are
not rebuilt per step. Each step changes them by diffs only:

    add(block_ids)          a new request: a free row, its whole table
    extend(row, ids)        a running request grew: the new ids after the last one
    replace(row, ids)       back from preemption: a new table
    put(row, ids)           a new table at a row chosen elsewhere (another KV group's)
    remove(row)             finished: the row is free again (its contents are left)

The host copy (numpy) is written at once; the same writes are queued as (flat index, block
id) pairs and applied on the device by `sync()`: one host-to-device copy and one scatter a
step, and usually only a handful of pairs (a decoding request needs a new block every
block_size tokens). A step's attention then reads its requests' rows with one gather by row
index on the device (`gather`), so the host never builds or copies whole tables.

On a CPU device the device table is the host array itself (no copies at all).
"""

from __future__ import annotations

import numpy as np
import torch


class BlockTables:
    def __init__(self, num_rows: int, max_blocks: int, device: torch.device) -> None:
        self.device = device
        self.max_blocks = max_blocks
        self.host = np.zeros((num_rows, max_blocks), dtype=np.int64)
        self.num_blocks = np.zeros(num_rows, dtype=np.int64)  # valid ids per row
        self.free_rows = list(range(num_rows - 1, -1, -1))  # pop() gives the lowest row
        self._dirty_idx: list[np.ndarray] = []  # flat indices into the table ...
        self._dirty_val: list[np.ndarray] = []  # ... and the block ids written there
        self.device_table = self._device_view()

    def _device_view(self) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(self.host)  # shares memory: writes need no sync
        return torch.zeros(self.host.shape, dtype=torch.int64, device=self.device)

    @property
    def num_rows(self) -> int:
        return self.host.shape[0]

    # ---- diffs ------------------------------------------------------------------------

    def add(self, block_ids: list[int]) -> int:
        if not self.free_rows:
            self._grow()
        row = self.free_rows.pop()
        self.num_blocks[row] = 0
        self.extend(row, block_ids)
        return row

    def extend(self, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.max_blocks:
            raise ValueError(f"a request needs {end} blocks; a table row holds {self.max_blocks}")
        ids = np.asarray(block_ids, dtype=np.int64)
        self.host[row, start:end] = ids
        self.num_blocks[row] = end
        if self.device.type != "cpu":
            self._dirty_idx.append(row * self.max_blocks + np.arange(start, end))
            self._dirty_val.append(ids)

    def replace(self, row: int, block_ids: list[int]) -> None:
        self.num_blocks[row] = 0
        self.extend(row, block_ids)

    def put(self, row: int, block_ids: list[int]) -> None:
        """A whole table at a row another table chose: a second KV group's tables follow
        the first group's rows (worker/kv_groups.py)."""
        while row >= self.num_rows:
            self._grow()
        self.replace(row, block_ids)

    def remove(self, row: int) -> None:
        self.free_rows.append(row)

    def _grow(self) -> None:
        """Double the rows (more requests held than expected: preempted ones keep theirs).
        Pending diffs are dropped: the new device table is copied whole from the host."""
        old = self.num_rows
        self.host = np.concatenate([self.host, np.zeros_like(self.host)])
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros_like(self.num_blocks)])
        self.free_rows = list(range(2 * old - 1, old - 1, -1)) + self.free_rows
        self._dirty_idx, self._dirty_val = [], []
        self.device_table = self._device_view()
        if self.device.type != "cpu":
            self.device_table.copy_(torch.from_numpy(self.host))

    # ---- once a step ------------------------------------------------------------------

    def sync(self) -> None:
        """Apply the queued writes on the device: one copy of the pairs, one scatter. The
        copy is pinned and non-blocking, so it never waits for work already queued."""
        if not self._dirty_idx:
            return
        pairs = np.stack([np.concatenate(self._dirty_idx), np.concatenate(self._dirty_val)])
        self._dirty_idx, self._dirty_val = [], []
        pairs_d = torch.from_numpy(pairs).pin_memory().to(self.device, non_blocking=True)
        self.device_table.view(-1).index_copy_(0, pairs_d[0], pairs_d[1])

    def gather(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """[len(rows), width] tables of the given rows (a device tensor of row indices)."""
        return self.device_table[:, :width].index_select(0, rows)
