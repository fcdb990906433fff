"""CUDA graphs of the model's forward pass for decode-only steps.

A decode step of B requests has one query token per request, so its shapes depend on B
alone. For each size in `sizes` the forward pass is captured once into a CUDA graph; a
step of B requests replays the smallest captured size >= B with the rows past B padded:

    input buffers (allocated once, never moved; the graphs read them by address, and so
    every tensor a graph captured, the attention plans included, is kept alive here)
        input_ids   [max]          token of each row           padding: 0
        positions   [max]          its position                padding: 0
        slot_mapping[max]          cache slot to write its K/V padding: -1 (not written)
        seq_lens    [max]          tokens with K/V after it     padding: 1
        block_tables[max, width]   its blocks                  padding: row of block 0
        query_start_loc [max + 1]  arange: row i owns query token i (fixed)

With KV groups (worker/kv_groups.py) each group after the first has a slot_mapping row and
a block_tables buffer of its own, and the captured metadata a view per group.

A padded row attends to slot 0 of block 0, which the model runner keeps zeroed, so it
produces finite garbage that nobody reads. All graphs share one memory pool; they are
captured largest first, so the smaller ones fit in what the larger ones reserved.

The attention backend must be graph-safe for decodes: `decode_plan(n, device)` gives the
fixed per-step plan the graph captures (the Triton backend has one; the torch reference
plans on the host and runs eagerly). Sizes too small to fill the GPU with one attention
program per sequence and KV head get a second graph whose attention is split-KV
(flash-decoding, `decode_plan(n, device, split=True)`); a step replays it when its longest
context is long enough to pay for the split (`graph_wants_split`). The split kernels take
each sequence's partitions from its length in device memory, so one graph serves every
context length.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time

import numpy as np
import torch

from cadence.attention.base import AttentionMetadata
from cadence.worker.block_tables import BlockTables

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def gc_paused():
    """Collect garbage now, then keep the collector off while graphs are captured: a
    collection mid-capture can free another engine's CUDA graphs (an LLM dropped earlier
    in this process), and destroying a graph is not permitted while a stream captures, so
    the capture would fail."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (max_batch itself included)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if max_batch not in sizes:
        sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeGraphs:
    def __init__(
        self,
        model,
        backend,
        device: torch.device,
        max_batch: int,
        max_blocks_per_seq: int,
        block_size: int,
        num_groups: int = 1,
    ) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.block_size = block_size
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        with torch.device(device):
            # One [4 + groups - 1, n] tensor, so a step's token-level inputs arrive in one
            # copy: ids, positions, slots, seq_lens, then the other groups' slots.
            self.token_inputs = torch.zeros((3 + num_groups, n), dtype=torch.int64)
            self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int64)
            self.group_block_tables = [
                torch.zeros((n, max_blocks_per_seq), dtype=torch.int64)
                for _ in range(num_groups - 1)
            ]
            self.query_start_loc = torch.arange(n + 1, dtype=torch.int64)
        self.input_ids, self.positions, self.slot_mapping, self.seq_lens = self.token_inputs[:4]
        self.group_slot_mapping = list(self.token_inputs[4:])
        self.token_inputs[2].fill_(-1)
        self.token_inputs[4:].fill_(-1)
        self.seq_lens.fill_(1)
        # Keyed by (size, split); kept alive, as the graphs read their plans.
        self.metas: dict[tuple[int, bool], AttentionMetadata] = {}
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.memory_taken = 0  # bytes: set by capture()
        self.outputs: dict[tuple[int, bool], torch.Tensor] = {}  # hidden states [size, hidden]
        # The model's aux_hidden (EAGLE-3's inputs) as each graph left them, if it keeps any.
        self.aux: dict[tuple[int, bool], list[torch.Tensor]] = {}
        split = backend.capabilities.split_kv
        self.split_sizes = [s for s in self.sizes if split and backend.graph_split_parts(s, device)]
        self.num_replays = 0
        self.num_split_replays = 0

    def _meta(self, size: int, split: bool) -> AttentionMetadata:
        meta = AttentionMetadata(
            num_tokens=size,
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            query_lens_cpu=[1] * size,
            seq_lens_cpu=[1] * size,
            block_size=self.block_size,
        )
        if split:
            meta.backend_data = self.backend.decode_plan(size, self.device, split=True)
        else:
            meta.backend_data = self.backend.decode_plan(size, self.device)
        if self.group_block_tables:
            meta.groups = [meta] + [
                self.backend.for_group(meta, tables[:size], slots[:size])
                for tables, slots in zip(self.group_block_tables, self.group_slot_mapping)
            ]
        return meta

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every size; returns the seconds it took. `memory_taken`: the device
        bytes the capture took (the graphs' pool, their buffers, compiled kernels), to set
        against the memory profile's reserve for them."""
        t0 = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with gc_paused(), torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                for split in (False, True) if size in self.split_sizes else (False,):
                    meta = self.metas[size, split] = self._meta(size, split)
                    ids, pos = self.input_ids[:size], self.positions[:size]
                    self.model(ids, pos, meta)  # warm-up: compiles kernels outside the graph
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.outputs[size, split] = self.model(ids, pos, meta)
                    aux = getattr(self.model, "aux_hidden", None) or ()
                    self.aux[size, split] = list(aux)
                    pool = graph.pool()
                    self.graphs[size, split] = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.memory_taken = free_before - torch.cuda.mem_get_info(self.device)[0]
        return time.perf_counter() - t0

    def size_for(self, num_reqs: int) -> int | None:
        """The captured size that serves `num_reqs` decodes, or None (run eagerly)."""
        for size in self.sizes:
            if size >= num_reqs:
                return size
        return None

    def run(
        self,
        size: int,
        token_inputs: np.ndarray,  # [5 + groups - 1, B] int64: see below
        tables: BlockTables,
        width: int,
        fill: tuple[torch.Tensor, torch.Tensor] | None = None,
        group_tables: list[BlockTables] | tuple = (),
    ) -> torch.Tensor:
        """Stage the step's inputs (padded on the host) in pinned memory, copy them into
        the graph's buffers without blocking (one copy), gather the B block-table rows
        from the persistent device table into the graph's table, replay. Returns hidden
        states [B, hidden]. Fresh pinned staging each step: PyTorch's pinned allocator
        reuses a block only after its copy ran, which a reused staging buffer could not
        promise once the next step is prepared while this one runs (async scheduling).

        `token_inputs` rows: ids, positions, slots, seq_lens, the slots of each KV group
        after the first (`group_tables`' rows are the same), table rows last."""
        rows, b = token_inputs.shape
        host = torch.empty((rows, size), dtype=torch.int64, pin_memory=True)
        host[:, :b] = torch.from_numpy(token_inputs)
        if size > b:  # padding rows: token 0 at position 0, no K/V write, one key
            host[:4, b:] = torch.tensor([[0], [0], [-1], [1]])
            host[4:, b:] = -1  # (no write in any group)
            host[-1, b:] = 0  # table row 0
        staged = host.to(self.device, non_blocking=True)
        self.token_inputs[:, :size].copy_(staged[:-1])
        for buffer, table in zip(
            [self.block_tables, *self.group_block_tables], [tables, *group_tables]
        ):
            buffer[:size, :width] = table.gather(staged[-1], width)
            if size > b:
                buffer[b:size, 0] = 0  # a padding row reads the zeroed block 0
        if fill is not None:  # (rows, ids): token ids still on the device (async scheduling)
            self.input_ids[fill[0]] = fill[1]
        split = size in self.split_sizes and self.backend.graph_wants_split(
            size, int(token_inputs[3].max()), self.device
        )
        self.graphs[size, split].replay()
        self.num_replays += 1
        self.num_split_replays += split
        if self.aux[size, split]:  # EAGLE-3 reads these hidden states (keep_aux_hidden)
            self.model.aux_hidden = [a[:b] for a in self.aux[size, split]]
        return self.outputs[size, split][:b]
