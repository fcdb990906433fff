"""Which tokens of a step read which adapter slot.

The worker plans each step before its forward pass (`plan`, a slot per token, -1 for the
base model); every LoRA projection of the model reads the same plan:

    order  the step's adapter tokens, grouped by slot (stable: batch order inside a group)
    tiles  [max tiles, 3]: (slot, start, end) into `order`, each slot's run cut into tiles
           of up to BLOCK_M tokens; the rest of the table is (-1, 0, 0)

On a GPU both live in fixed device buffers the Triton kernels read (a CUDA graph replays
them with whatever the last plan wrote); on a CPU the plan is a list of (slot, rows) the
torch products loop over. A step without an adapter token skips the products, except
while a CUDA graph is being captured (its replays must hold them).
"""

from __future__ import annotations

import numpy as np
import torch

from cadence.ops.lora_tiles import BLOCK_M, max_tiles


class LoRABatch:
    def __init__(
        self,
        num_slots: int,
        max_tokens: int,
        device: torch.device,
        kernels: bool | None = None,
    ) -> None:
        """`kernels`: run the Triton products (default: on a GPU; tests set it to run them
        under Triton's interpreter)."""
        self.num_slots = num_slots
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.kernels = self.on_gpu if kernels is None else kernels
        self.order = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self._num_tiles = max_tiles(max_tokens, num_slots)
        self.tiles = torch.zeros(self._num_tiles, 3, dtype=torch.int32, device=device)
        self.tiles[:, 0] = -1
        self.any = False  # whether the planned step has a token of an adapter
        self.runs: list[tuple[int, slice | torch.Tensor]] = []  # the CPU path's plan
        self._side: torch.cuda.Stream | None = None  # where shrinks run beside base GEMMs

    def plan(self, token_slots: np.ndarray) -> None:
        """`token_slots`: one slot (or -1) per token of the step, in batch order."""
        token_slots = np.asarray(token_slots, dtype=np.int64)
        if len(token_slots) > len(self.order):
            raise ValueError(f"{len(token_slots)} tokens > the LoRA plan's {len(self.order)}")
        adapted = token_slots >= 0
        self.any = bool(adapted.any())
        order = np.argsort(token_slots, kind="stable")[int((~adapted).sum()) :]
        counts = np.bincount(token_slots[adapted], minlength=self.num_slots)
        seg = np.zeros(self.num_slots + 1, dtype=np.int64)
        np.cumsum(counts, out=seg[1:])
        if self.kernels:
            self._to_device(order, counts, seg)
            return
        self.runs = []
        for slot in np.flatnonzero(counts):
            rows = order[seg[slot] : seg[slot + 1]]
            if rows[-1] - rows[0] + 1 == len(rows):  # one request's tokens: a slice
                self.runs.append((int(slot), slice(int(rows[0]), int(rows[-1]) + 1)))
            else:
                self.runs.append((int(slot), torch.from_numpy(rows)))

    def _to_device(self, order: np.ndarray, counts: np.ndarray, seg: np.ndarray) -> None:
        tiles = np.zeros((self._num_tiles, 3), dtype=np.int64)
        tiles[:, 0] = -1
        i = 0
        for slot in np.flatnonzero(counts):
            starts = np.arange(seg[slot], seg[slot + 1], BLOCK_M)
            part = tiles[i : i + len(starts)]
            part[:, 0], part[:, 1] = slot, starts
            part[:, 2] = np.minimum(starts + BLOCK_M, seg[slot + 1])
            i += len(starts)
        both = torch.from_numpy(np.concatenate([tiles.ravel(), order]).astype(np.int32))
        if self.on_gpu:
            both = both.pin_memory().to(self.device, non_blocking=True)
        self.tiles.view(-1).copy_(both[: tiles.size])
        self.order[: len(order)].copy_(both[tiles.size :])

    def clear(self) -> None:
        """No token reads an adapter (warm-up and capture passes)."""
        self.tiles[:, 0] = -1
        self.any = False
        self.runs = []

    def shrink(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor | None:
        """Start x A for the planned tokens, before the base product: on a GPU on a side
        stream, so it runs beside the base GEMM (both only read x); `expand` joins it.
        None: nothing to start (no adapter token, or the CPU path)."""
        if not self.kernels or not (
            self.any or (self.on_gpu and torch.cuda.is_current_stream_capturing())
        ):
            return None
        from cadence.ops.lora_kernels import lora_shrink, shrink_buffer

        s = shrink_buffer(x, a)  # (on the main stream: freed there, after the join)
        if not self.on_gpu:
            return lora_shrink(x, a, self.order, self.tiles, s)
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(torch.cuda.current_stream(self.device))  # x is ready
        with torch.cuda.stream(self._side):
            return lora_shrink(x, a, self.order, self.tiles, s)

    def expand(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        s: torch.Tensor | None,
        a: torch.Tensor,
        b: torch.Tensor,
    ) -> None:
        """y += (x A) B for each planned token, in place, after the base product. `s`:
        what shrink() returned; without it (the CPU path) the products all run here."""
        if s is not None:
            from cadence.ops.lora_kernels import lora_expand

            if self.on_gpu:
                torch.cuda.current_stream(self.device).wait_stream(self._side)
            lora_expand(y, s, b, self.order, self.tiles)
            return
        for slot, rows in self.runs:
            delta = (x[rows] @ a[slot]) @ b[slot]
            if isinstance(rows, slice):
                y[rows] += delta
            else:
                y.index_add_(0, rows, delta)

    def add(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """y += x A B for each planned token (in place): shrink and expand at once."""
        self.expand(y, x, self.shrink(x, a), a, b)
