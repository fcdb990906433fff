"""Embeddings in the runner: a pooling model's requests fold their prompt's final hidden
states into one vector as their prefill chunks run (`--runner pooling`).

    LAST  the state at the prompt's last position (the chunk that reaches it)
    CLS   the state at position 0 (the first chunk)
    MEAN  the float32 sum over every prompt position, divided by the prompt's length

A chunk's rows are contiguous in the step's flat batch, so each request reads a slice of
`hidden` (copied: a CUDA graph's output buffer is overwritten next step); nothing else in
the step pays. MEAN keeps `next_pos` so that a prompt recomputed
after a preemption never counts a position twice (MEAN and CLS run without prefix-cache
hits: a cached position has no hidden state). The vector goes out with the request's one
sampled token (pooling requests ask for max_tokens 1), as float32 bytes, raw: truncation
(Matryoshka) and normalization are the caller's (cadence/embeddings.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.worker.transfer import to_host_async


@dataclass
class PoolingState:
    """One pooling request's vector in the making."""

    pooling_type: str  # LAST | MEAN | CLS
    num_prompt_tokens: int
    next_pos: int = 0  # MEAN: positions [0, next_pos) are in `acc`
    acc: torch.Tensor | None = None  # [hidden] float32, on the device
    host: torch.Tensor | None = None  # the finished vector, on the host (or being copied)
    ready: torch.cuda.Event | None = None  # passed: `host` has landed
    sent: bool = False

    def fold(self, hidden: torch.Tensor, row: int, start: int, end: int) -> None:
        """This step computed positions [start, end) at rows [row, row + end - start)."""
        p = self.num_prompt_tokens
        if self.pooling_type == "LAST":
            if start <= p - 1 < end:
                self.acc = hidden[row + p - 1 - start].to(torch.float32, copy=True)
        elif self.pooling_type == "CLS":
            if start == 0:
                self.acc = hidden[row].to(torch.float32, copy=True)
        else:
            lo, hi = max(start, self.next_pos), min(end, p)
            if hi > lo:
                part = hidden[row + lo - start : row + hi - start].float().sum(0)
                self.acc = part if self.acc is None else self.acc + part
                self.next_pos = hi
        if end >= p and self.acc is not None:
            # The prompt is complete: start the vector's copy to the host now, so reading it
            # with the request's token (a step later under async scheduling) waits for this
            # step's work only, not the next one's.
            vec = self.acc / p if self.pooling_type == "MEAN" else self.acc
            self.host = to_host_async(vec) if vec.is_cuda else vec
            self.ready = None
            if vec.is_cuda:
                self.ready = torch.cuda.Event()
                self.ready.record()

    def take(self) -> bytes:
        """The pooled vector (float32 bytes), once: with the request's first token every
        prompt position has been computed."""
        self.sent = True
        if self.host is None:
            raise RuntimeError("a pooling request reached its first token unpooled")
        if self.ready is not None:
            self.ready.synchronize()
        out = self.host.numpy().tobytes()
        self.acc = self.host = self.ready = None
        return out
