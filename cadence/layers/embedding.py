"""The vocabulary split over ranks: the token embedding and the LM head.

Each rank holds a contiguous range of ceil(vocab / ranks) rows (the last range padded with
zero rows). The embedding looks up the ids in its range, zeroes the others, and the ranks'
rows are summed (exactly one rank contributes each token's row). The LM head computes the
logits of its range; they are gathered only where sampling needs the whole vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.distributed.communication import all_gather_last, all_reduce
from cadence.distributed.parallel_state import get_tp
from cadence.quant.base import current_method, shape_of


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        tp = get_tp()
        self.vocab_size = vocab_size
        self.rows = -(-vocab_size // tp.size)
        self.start = tp.rank * self.rows
        self.end = min(self.start + self.rows, vocab_size)  # rows past it are padding
        self.tp_size = tp.size
        self.hidden_size = hidden_size
        self.quant_method = current_method().embedding()
        self.quant_method.create_weights(self, self.rows, hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.embed(self, ids)
        mine = (ids >= self.start) & (ids < self.end)
        local = torch.where(mine, ids - self.start, 0)
        out = self.quant_method.embed(self, local)
        return all_reduce(out * mine.unsqueeze(-1).to(out.dtype))

    def load(self, kind: str, source, shard: int = 0) -> None:
        shape = shape_of(source)
        if kind != "weight" or shape != (self.vocab_size, self.hidden_size):
            raise ValueError(f"{kind} of shape {shape} does not fit the vocabulary")
        self.quant_method.load(self, source, slice(self.start, self.end), self.end - self.start)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> logits [T, vocab] over every rank's rows (the LM head)."""
        local = self.quant_method.logits(self, hidden)
        if self.tp_size == 1:
            return local
        return all_gather_last(local)[:, : self.vocab_size]


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection of an untied model: the same row split, used only for logits."""

    serves_lookup = False  # a packed format need not keep its rows for lookups

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden)
