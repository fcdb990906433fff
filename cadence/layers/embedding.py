"""The vocabulary split over ranks: the token embedding and the LM head.

Each rank holds a contiguous range of ceil(vocab / ranks) rows (the last range padded with
zero rows). The embedding looks up the ids in its range, zeroes the others, and the ranks'
rows are summed (exactly one rank contributes each token's row). The LM head computes the
logits of its range; they are gathered only where sampling needs the whole vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadence.distributed.communication import all_gather_last, all_reduce
from cadence.distributed.parallel_state import get_tp
from cadence.layers.linear import shape_of


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        tp = get_tp()
        self.vocab_size = vocab_size
        self.rows = -(-vocab_size // tp.size)
        self.start = tp.rank * self.rows
        self.end = min(self.start + self.rows, vocab_size)  # rows past it are padding
        self.tp_size = tp.size
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        mine = (ids >= self.start) & (ids < self.end)
        local = torch.where(mine, ids - self.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out)

    def load(self, kind: str, source, shard: int = 0) -> None:
        shape = shape_of(source)
        if kind != "weight" or shape != (self.vocab_size, self.weight.shape[1]):
            raise ValueError(f"{kind} of shape {shape} does not fit the vocabulary")
        n = self.end - self.start
        self.weight.data[:n].copy_(source[self.start : self.end])
        self.weight.data[n:].zero_()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> logits [T, vocab] over every rank's rows (the LM head)."""
        local = hidden @ self.weight.t()
        if self.tp_size == 1:
            return local
        return all_gather_last(local)[:, : self.vocab_size]


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection of an untied model: the same row split, used only for logits."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden)
