"""CUDA graphs of small prefill and mixed steps: the lean launch path for short prompts.

A step that carries prefill tokens runs ~300 kernels for Llama-8B; launched eagerly from
Python each costs tens of microseconds of host time, so a 128-token prompt's prefill
waits ~12 ms on launches for ~4 ms of GPU work, and that is its time to first token.
Here such steps replay a CUDA graph captured for a token bucket (`BUCKETS`, up to 2,048
tokens; bigger steps are compute-bound and run eagerly). The graphs share one memory pool,
as large as the largest bucket's activations (the memory profile reserves it). Everything
a step varies is data in buffers the graphs read by address:

    tokens        [3, T]      ids, positions, cache slots           padding: 0, 0, -1
                              (then each later KV group's slots)    padding: -1
    query_start   [R + 3]     request r owns tokens [qs[r], qs[r+1])
    seq_lens      [R + 2]     tokens with K/V after the step        padding: 1
    block_tables  [R + 2, W]  rows gathered from the persistent table
    work          [2, I]      kernel B's items (request, first token) padding: (R + 1, 0)

R is max_num_seqs; request R + 1 is empty (qs[R + 1] = qs[R + 2] = 0), so a padding work
item owns no tokens and its programs return at once. Work items are MAX_WORK_Q tokens, the
kernel's tile fixed for every bucket, and a bucket of T tokens has room for
min(T, R) + T // MAX_WORK_Q + 1 items: the most a step of T tokens can have. Padding
tokens belong to no request: nothing attends for them and their rows are never read.

A step whose decodes the backend would give split-KV (long contexts beside a small
prefill) runs eagerly: these graphs attend with kernel B alone.

On by default where `cadence serve` runs on a GPU, off offline (`--cuda-graph-prefill` /
`--no-cuda-graph-prefill` decide): on an H200 with Llama-3.1-8B's shape it takes a 128-token
prompt's time to first token from 12 to 6 ms, and a step that carries a prompt chunk beside
256 decodes stops waiting 25-35 ms on launches; but with these graphs captured, batch-1
decode steps measured 3 % slower (4.63 against 4.49 ms, the same in every lease), with GPU
kernel time unchanged. Capture order, sharing the decode graphs' memory pool, fewer buckets
and a frozen GC did not change it; the cause is not found yet.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from cadence.attention.base import AttentionMetadata, BackendCapabilities
from cadence.config import MIXED_GRAPH_TOKENS, EngineConfig, SchedulerConfig
from cadence.worker.block_tables import BlockTables
from cadence.worker.cuda_graphs import gc_paused

logger = logging.getLogger(__name__)

# Step token counts captured. Past 512 the steps are mostly compute (19 us a prompt token on
# Llama-8B's shape), but eagerly they also wait 25-35 ms on launches on a busy host, and a
# decoding request waits for the whole step. Buckets 256 apart: a step past 512 tokens fills
# at least two thirds of its bucket.
BUCKETS = (16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, MIXED_GRAPH_TOKENS)


def largest_bucket(max_tokens: int) -> int:
    """The most tokens a captured step holds with a token budget of `max_tokens`."""
    return min(max_tokens, BUCKETS[-1])


def captures_mixed_steps(config: EngineConfig, caps: BackendCapabilities, drafting: bool) -> bool:
    """Whether a CUDA runner captures these graphs (and the memory profile reserves their
    pool): graphs at all, a backend whose decode and mixed steps replay, and prefill graphs
    asked for or drafts to verify."""
    wanted = bool(config.cuda_graph_prefill) or drafting
    return wanted and not config.enforce_eager and caps.decode_graphs and caps.mixed_graphs


def mixed_step_tokens(sc: SchedulerConfig, drafting: bool) -> int:
    """The largest step the graphs are for: the token budget, or, with prompt tokens bounded
    beside decodes (and no drafts to verify), that bound plus one token a decode. A larger
    step has no decode in it, so no stream waits on its launches: it runs eagerly."""
    bound = sc.max_prefill_tokens_while_decoding
    if bound and not drafting:
        return min(sc.max_num_batched_tokens, bound + sc.max_num_seqs)
    return sc.max_num_batched_tokens


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def max_items(num_tokens: int, max_reqs: int, work_q: int) -> int:
    """Kernel-B work items a step of `num_tokens` tokens can need, over any split into
    at most `max_reqs` requests: sum of ceil(q_r / work_q) <= requests + tokens / work_q."""
    return min(num_tokens, max_reqs) + num_tokens // work_q + 1


class MixedGraphs:
    def __init__(
        self,
        model,
        backend,
        device: torch.device,
        max_tokens: int,
        max_reqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        num_groups: int = 1,
    ) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.block_size = block_size
        from cadence.attention.triton_paged import work_items  # (imports triton: CUDA only)

        self.work_items = work_items  # kernel B's item planning, as build() does it
        self.work_q = backend.MIXED_GRAPH_WORK_Q
        # A budget-filling scheduler makes steps of exactly max_tokens: capture that too.
        self.sizes = [t for t in BUCKETS if t < max_tokens]
        if max_tokens <= BUCKETS[-1]:
            self.sizes.append(max_tokens)
        self.max_reqs = max_reqs
        self.empty_req = max_reqs + 1
        t_max, r = self.sizes[-1], max_reqs
        self.num_items = {t: max_items(t, r, self.work_q) for t in self.sizes}
        # Every segment starts 16-byte aligned, as the kernels were compiled for (warm-up
        # and eager steps pass aligned tensors; an unaligned one is another variant).
        self.t_pad = _round_up(t_max, 2)
        self.qs_len = _round_up(r + 3, 2)
        i_pad = _round_up(self.num_items[t_max], 4)
        self.tok_rows = 2 + num_groups  # ids, positions, each group's slots
        tok = self.tok_rows * self.t_pad
        with torch.device(device):
            # token-level and request-level ints in one buffer: one copy a step
            self.ints = torch.zeros(tok + self.qs_len + r + 2, dtype=torch.int64)
            self.work = torch.zeros((2, i_pad), dtype=torch.int32)
            self.block_tables = torch.zeros((r + 2, max_blocks_per_seq), dtype=torch.int64)
            self.group_block_tables = [
                torch.zeros((r + 2, max_blocks_per_seq), dtype=torch.int64)
                for _ in range(num_groups - 1)
            ]
        self.tokens = self.ints[:tok].view(self.tok_rows, self.t_pad)
        self.query_start = self.ints[tok : tok + r + 3]
        self.seq_lens = self.ints[tok + self.qs_len :]
        self.t_max = t_max
        self._reset()
        self.metas: dict[int, AttentionMetadata] = {}  # kept alive: the graphs read them
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.aux: dict[int, list[torch.Tensor]] = {}  # the model's aux_hidden, per bucket
        self.num_replays = 0

    def _reset(self) -> None:
        """Every item padding, every token unwritten: a replay that touches nothing."""
        self.tokens[2:].fill_(-1)
        self.seq_lens.fill_(1)
        self.work[0].fill_(self.empty_req)
        self.work[1].fill_(0)

    def _meta(self, size: int) -> AttentionMetadata:
        n = self.num_items[size]
        meta = AttentionMetadata(
            num_tokens=size,
            query_start_loc=self.query_start,
            seq_lens=self.seq_lens,
            slot_mapping=self.tokens[2, :size],
            block_tables=self.block_tables,
            query_lens_cpu=[],
            seq_lens_cpu=[],
            block_size=self.block_size,
        )
        meta.backend_data = self.backend.mixed_graph_plan(self.work[0, :n], self.work[1, :n])
        if self.group_block_tables:
            meta.groups = [meta] + [
                self.backend.for_group(meta, tables, self.tokens[3 + g, :size])
                for g, tables in enumerate(self.group_block_tables)
            ]
        return meta

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every bucket (largest first, sharing one pool); returns the seconds."""
        t0 = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with gc_paused(), torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                meta = self.metas[size] = self._meta(size)
                ids, pos = self.tokens[0, :size], self.tokens[1, :size]
                self.model(ids, pos, meta)  # warm-up outside the graph
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[size] = self.model(ids, pos, meta)
                self.aux[size] = list(getattr(self.model, "aux_hidden", None) or ())
                pool = graph.pool()
                self.graphs[size] = graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def size_for(self, query_lens: np.ndarray, seq_lens: np.ndarray) -> int | None:
        """The bucket that serves a step, or None (run eagerly)."""
        num_tokens = int(query_lens.sum())
        if len(query_lens) > self.max_reqs or num_tokens > self.t_max:
            return None
        decodes = query_lens == 1
        if decodes.any() and self.backend.split_parts(
            int(decodes.sum()),
            int(seq_lens[decodes].max()),
            int(query_lens[~decodes].sum()),
            self.device,
        ):
            return None
        for size in self.sizes:
            if size >= num_tokens:
                return size
        return None

    def run(
        self,
        size: int,
        tokens: np.ndarray,  # [3, T] int64: ids, positions, slots (then later groups')
        query_lens: np.ndarray,  # [B] int64
        seq_lens: np.ndarray,  # [B] int64
        rows: np.ndarray,  # [B] int64: each request's row of `tables`
        tables: BlockTables,
        width: int,
        fill: tuple[torch.Tensor, torch.Tensor] | None = None,
        group_tables: list[BlockTables] | tuple = (),
    ) -> torch.Tensor:
        """Stage the step's inputs (padded on the host) in pinned memory, copy them into
        the graph's buffers without blocking, gather the block-table rows, replay.
        Returns hidden states [T, hidden]."""
        t, b, r = tokens.shape[1], len(query_lens), self.max_reqs
        work_req, work_qoff = (
            t.numpy() for t in self.work_items(torch.from_numpy(query_lens), self.work_q)
        )
        n_items = len(work_req)
        # One pinned staging buffer: the ints, the work items, the table rows to gather.
        n_ints, n_work = self.ints.numel(), self.work.numel()
        # (Allocated pinned: .pin_memory() on a fresh tensor costs a copy and ~0.2 ms.)
        host = torch.zeros(n_ints + n_work + b, dtype=torch.int64, pin_memory=True)
        h = host.numpy()
        n_tok = self.tok_rows * self.t_pad
        tok = h[:n_tok].reshape(self.tok_rows, self.t_pad)
        tok[:, :t] = tokens
        tok[2:, t:] = -1
        qs = h[n_tok : n_tok + r + 3]
        qs[1 : b + 1] = np.cumsum(query_lens)  # qs[r + 1] = qs[r + 2] = 0: the empty request
        sl = h[n_tok + self.qs_len : n_ints]
        sl[:] = 1
        sl[:b] = seq_lens
        work = h[n_ints : n_ints + n_work].reshape(2, -1)
        work[0, :] = self.empty_req
        work[0, :n_items] = work_req
        work[1, :n_items] = work_qoff
        h[n_ints + n_work :] = rows
        staged = host.to(self.device, non_blocking=True)
        self.ints.copy_(staged[:n_ints])
        self.work.copy_(staged[n_ints : n_ints + n_work].view(2, -1))
        table_rows = staged[n_ints + n_work :]
        for buffer, table in zip(
            [self.block_tables, *self.group_block_tables], [tables, *group_tables]
        ):
            buffer[:b, :width] = table.gather(table_rows, width)
        if fill is not None:  # (rows, ids): token ids still on the device (async scheduling)
            self.tokens[0][fill[0]] = fill[1]
        self.graphs[size].replay()
        self.num_replays += 1
        if self.aux[size]:  # EAGLE-3 reads these hidden states (keep_aux_hidden)
            self.model.aux_hidden = [a[:t] for a in self.aux[size]]
        return self.outputs[size][:t]
