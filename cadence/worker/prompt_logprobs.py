"""Prompt logprobs: log-softmax over the vocabulary at the prompt positions of each prefill
chunk, for the requests that ask for them (`SamplingParams.prompt_logprobs`).

Position p of a prompt of P tokens predicts prompt token p + 1, so positions 0 .. P - 2
give the logprobs of tokens 1 .. P - 1; token 0 has none (None). Position P - 1 predicts
the first output token: that row belongs to the sampler, not here.

A chunk's positions are computed in the step that runs the chunk (the step's other rows
never pay: only the rows listed in a `PromptRows` go through the LM head), copied to the
host without waiting, and handed over as a whole with the request's first sampled token.
A request keeps `PromptLogprobsState.next_pos` across a preemption, so recomputing its
prompt emits nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from cadence.worker.transfer import to_device_aligned, to_host_async

logger = logging.getLogger(__name__)

# (the prompt token's own logprob, [(token id, logprob)] of the top k); None for token 0
PromptLogprob = tuple[float, list[tuple[int, float]]] | None


@dataclass
class PromptRows:
    """One step's prompt-logprob positions: where they sit in the step's flat batch and
    which prompt token each one predicts. `result` is filled by `compute`."""

    rows: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    max_k: int = 0
    result: _StepResult | None = None


class _StepResult:
    """One step's prompt logprobs, on the host (CPU) or being copied there (CUDA)."""

    def __init__(
        self,
        own: torch.Tensor,
        top_ids: torch.Tensor | None,
        top_lps: torch.Tensor | None,
        ready: torch.cuda.Event | None,
    ) -> None:
        self._tensors = (own, top_ids, top_lps)
        self._ready = ready
        self._lists: tuple[list, list | None, list | None] | None = None

    def entries(self, a: int, b: int, k: int) -> list[PromptLogprob]:
        """Rows [a, b) with each row's top k (k <= the step's max_k)."""
        if self._lists is None:
            if self._ready is not None:
                self._ready.synchronize()
            self._lists = tuple(None if t is None else t.tolist() for t in self._tensors)
            self._tensors = (None, None, None)  # the pinned copies can go
        own, ids, lps = self._lists
        if k == 0 or ids is None:
            return [(lp, []) for lp in own[a:b]]
        return [(own[i], list(zip(ids[i][:k], lps[i][:k]))) for i in range(a, b)]


@dataclass
class PromptLogprobsState:
    """One request's prompt logprobs in the runner, from admission to its first token."""

    k: int  # top k wanted at each position
    next_pos: int = 0  # positions [0, next_pos) are computed (or known to be missing)
    chunks: list[tuple[PromptRows | None, int, int]] = field(default_factory=list)
    sent: bool = False

    def plan(
        self,
        token_ids: list[int],
        num_prompt: int,
        start: int,
        end: int,
        base: int,
        step: PromptRows,
    ) -> None:
        """The request computes positions [start, end) this step, the first at flat row
        `base`: list those that are prompt positions not computed before."""
        last = num_prompt - 1  # positions [0, last) have prompt logprobs
        if self.sent or self.next_pos >= last or end <= self.next_pos:
            return
        if start > self.next_pos:
            # Prefix-cache hits are refused for these requests (cached positions have no
            # logits), so this is a bug elsewhere; keep the list aligned with the prompt.
            logger.warning("prompt logprobs of positions %d..%d are missing", self.next_pos, start)
            self.chunks.append((None, 0, min(start, last) - self.next_pos))
            self.next_pos = min(start, last)
        hi = min(end, last)
        if hi <= self.next_pos:
            return
        lo = self.next_pos
        first = len(step.rows)
        step.rows.extend(range(base + lo - start, base + hi - start))
        step.targets.extend(token_ids[lo + 1 : hi + 1])
        step.max_k = max(step.max_k, self.k)
        self.chunks.append((step, first, len(step.rows)))
        self.next_pos = hi

    def take(self) -> list[PromptLogprob]:
        """Every prompt token's entry, token 0's (None) first; once."""
        out: list[PromptLogprob] = [None]
        for step, a, b in self.chunks:
            out.extend([None] * (b - a) if step is None else step.result.entries(a, b, self.k))
        self.chunks = []
        self.sent = True
        return out


def compute(model, hidden: torch.Tensor, step: PromptRows, max_rows: int) -> None:
    """Fill `step.result` from the step's hidden states ([tokens, hidden], on the device).

    The LM head and a float32 log-softmax run over at most `max_rows` positions at a time:
    a long prompt chunk's full [tokens, vocab] logits could take gigabytes, more than the
    memory profile set aside (it measured the sampler over max_num_seqs rows)."""
    dev = hidden.device
    n, k = len(step.rows), step.max_k
    rows_d, targets_d = to_device_aligned([np.array(step.rows), np.array(step.targets)], dev)
    own, top_ids, top_lps = [], [], []
    for lo in range(0, n, max_rows):
        hi = min(n, lo + max_rows)
        logits = model.compute_logits(hidden[rows_d[lo:hi]])
        lps = torch.log_softmax(logits.float(), dim=-1)
        own.append(lps.gather(1, targets_d[lo:hi, None]).squeeze(1))
        if k > 0:
            values, ids = lps.topk(k, dim=-1)
            top_lps.append(values)
            top_ids.append(ids)
    tensors = (
        torch.cat(own),
        torch.cat(top_ids) if top_ids else None,
        torch.cat(top_lps) if top_lps else None,
    )
    ready = None
    if dev.type == "cuda":
        tensors = tuple(to_host_async(t) for t in tensors)
        ready = torch.cuda.Event()
        ready.record()
    step.result = _StepResult(*tensors, ready)
