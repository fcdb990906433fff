"""The proposer seam: who guesses the next tokens.

After each step's verification the decoder hands every proposer the same record of the
step (`StepRecord`): which requests ran which positions, the target's hidden states, and
for each request how many of its tokens are now final. A proposer returns up to k draft
tokens per request that sampled; the scheduler verifies them next step.

    ngram        prompt lookup over the request's own tokens (no model, no KV)
    draft_model  a smaller model with the target's tokenizer, its own KV cache in the
                 target's blocks (same block tables, a second tensor per layer)
    eagle3       EAGLE-3 heads: one decoder layer over three of the target's layers

Proposers that run a model write their K/V at the same slots as the target: the KV
manager reserves `num_speculative_tokens` lookahead slots past each request's scheduled
tokens for the guesses' K/V, and catches up over exactly the positions the target
computed, so a block the prefix cache shares holds valid draft K/V too.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from cadence.worker.batch_inputs import StepLayout
from cadence.worker.block_tables import BlockTables
from cadence.worker.cuda_graphs import DecodeGraphs
from cadence.worker.drafter import TargetView
from cadence.worker.kv_tensors import bind_kv_caches, kv_bytes_per_block
from cadence.worker.mixed_graphs import MixedGraphs

logger = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One step, after verification, as the proposers see it."""

    request_ids: list[str]  # in batch order
    layout: StepLayout  # positions and slots of the step's query tokens
    hidden: torch.Tensor  # [T, hidden] the target's final hidden states
    aux_hidden: list[torch.Tensor] | None  # EAGLE-3: [T, hidden] at the chosen layers
    # per request: tokens whose K/V is now final ([start, valid_end) of its query) ...
    valid_ends: list[int]
    # ... and whether it sampled (then token_ids[valid_end] is its new token)
    sampled: list[bool]
    token_ids: list[list[int]]  # each request's tokens (prompt + output) after the step
    tables: BlockTables  # the target's block tables (a draft model writes the same blocks)


class Proposer(ABC):
    needs_aux_hidden = False  # EAGLE-3: the target must keep three layers' hidden states

    def __init__(self, k: int) -> None:
        self.k = k  # drafts per request and step, at most

    def attention_layers(self) -> list:
        """The attention layers of its own model, whose K/V it keeps ([]: none)."""
        return []

    def kv_bytes_per_block(self) -> int:
        """Bytes of its own K/V per pool block (0: it keeps none)."""
        return 0

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        """Its K/V for `num_blocks` blocks (called once the pool is sized)."""
        return []

    def capture_graphs(self) -> None:
        """CUDA graphs of its own model's steps, if it has any (called once, on a GPU).
        A proposer without a model has none to capture."""
        return None

    @abstractmethod
    def propose(self, step: StepRecord, max_drafts: list[int]) -> list[list[int]]:
        """Draft tokens per request of `step` (in its order); [] for those that did not
        sample. `max_drafts[i]` caps request i's (the context's end)."""


class ModelProposer(Proposer):
    """A proposer that runs a model of its own (`kv_model`), whose attention layers keep
    K/V in the target's blocks: same block size, dtype and device as the target's."""

    kv_model: nn.Module  # set by the subclass; has attention_layers()

    def __init__(self, k: int, target: TargetView) -> None:
        super().__init__(k)
        self.target = target
        self.graphs: DecodeGraphs | None = None  # its guessing steps', once captured
        self.mixed: MixedGraphs | None = None  # its catch-ups', once captured

    def attention_layers(self) -> list:
        return self.kv_model.attention_layers()

    def kv_bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.kv_model, self.target.block_size, self.target.dtype)

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        r = self.target
        return bind_kv_caches(self.kv_model, num_blocks, r.block_size, r.dtype, r.device)

    def capture_step_graphs(self, backend, guess_model, catch_up_model, what: str) -> None:
        """CUDA graphs of its guessing steps (one token a request: `self.graphs`) and of
        its catch-ups (token buckets: `self.mixed`, where the backend has them). Eager, a
        small model's step is all kernel launches."""
        r = self.target
        t0 = time.perf_counter()
        sc = r.config.scheduler
        max_batch = min(r.config.max_cuda_graph_batch_size, sc.max_num_seqs)
        bs, width = r.block_size, r.max_blocks_per_seq
        self.graphs = DecodeGraphs(guess_model, backend, r.device, max_batch, width, bs)
        self.graphs.capture()
        if backend.capabilities.mixed_graphs:
            self.mixed = MixedGraphs(
                catch_up_model, backend, r.device, sc.max_num_batched_tokens, sc.max_num_seqs,
                width, bs,
            )  # fmt: skip
            self.mixed.capture()
        logger.info("captured the %s's CUDA graphs in %.1f s", what, time.perf_counter() - t0)

    @staticmethod
    def read_back(
        guesses: list[torch.Tensor], proposing: list[int], max_drafts: list[int], num_requests: int
    ) -> list[list[int]]:
        """Per request of the step: its guesses (one [P] tensor per guessing step, rows in
        `proposing` order), cut to its cap; [] for the others. The step's one read-back."""
        out: list[list[int]] = [[] for _ in range(num_requests)]
        for i, row in zip(proposing, torch.stack(guesses, dim=1).tolist()):
            out[i] = row[: max_drafts[i]]
        return out
