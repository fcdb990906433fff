"""A grammar that starts after a reasoning model's thinking.

    matcher = ThinkingMatcher(inner, end=[151668], start=151667, budget=512)

It stands in for the request's xgrammar matcher (same methods: the manager and the gate do
not tell them apart). Phases, one per output token:

    start      (only with `start`) the first token: `start` opens the thinking, any token
               the grammar allows skips it (a model that does not think this turn)
    thinking   any token, until the output holds `end` in a row; past `budget` thinking
               tokens only the rest of `end` is allowed (and jump-forward writes it)
    grammar    the inner matcher's (None: anything; the answer is free)

Each accepted token keeps the state before it, so `rollback` (speculative drafts) can step
back across a phase change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _State:
    phase: str  # start | thinking | grammar
    thought: int  # thinking tokens so far
    matched: int  # tokens of `end` at the output's tail
    to_inner: bool  # the token this state precedes went to the inner matcher


class ThinkingMatcher:
    def __init__(self, inner, end: list[int], start: int | None, budget: int | None) -> None:
        self.inner = inner  # an xgrammar GrammarMatcher, or None
        self.end = list(end)
        self.start = start
        self.budget = budget
        self.phase = "start" if start is not None else "thinking"
        self.thought = 0
        self.matched = 0
        self.history: list[_State] = []

    @property
    def violated(self) -> str | None:
        """The answer's run-time schema checks found a dead end (structured/checked.py)."""
        return getattr(self.inner, "violated", None)

    @property
    def over_budget(self) -> bool:
        return self.budget is not None and self.thought >= self.budget

    def accept_token(self, token: int) -> bool:
        before = _State(self.phase, self.thought, self.matched, self.phase == "grammar")
        if self.phase == "start":
            if token == self.start:
                self.phase = "thinking"
                self.history.append(before)
                return True
            self.phase = "grammar"
            before = _State("start", 0, 0, True)
        if self.phase == "thinking":
            if self.over_budget and token != self.end[self.matched]:
                return False
            self.thought += 1
            if token == self.end[self.matched]:
                self.matched += 1
            else:
                self.matched = 1 if token == self.end[0] else 0
            if self.matched == len(self.end):
                self.phase = "grammar"
            self.history.append(before)
            return True
        if self.inner is not None and not self.inner.accept_token(token):
            self.phase = before.phase  # (a rejected first token leaves "start" as it was)
            return False
        self.history.append(before)
        return True

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        undone = self.history[-n:]
        del self.history[-n:]
        to_inner = sum(1 for s in undone if s.to_inner)
        if to_inner and self.inner is not None:
            self.inner.rollback(to_inner)
        first = undone[0]
        self.phase, self.thought, self.matched = first.phase, first.thought, first.matched

    def is_terminated(self) -> bool:
        return self.phase == "grammar" and self.inner is not None and self.inner.is_terminated()

    def find_jump_forward_tokens(self) -> list[int]:
        if self.phase == "thinking":
            return self.end[self.matched :] if self.over_budget else []
        if self.phase == "grammar" and self.inner is not None:
            return self.inner.find_jump_forward_tokens()
        return []

    def fill_next_token_bitmask(self, mask: torch.Tensor, row: int) -> None:
        if self.phase == "thinking":
            if self.over_budget:
                mask[row].zero_()
                _allow(mask, row, self.end[self.matched])
            else:
                mask[row].fill_(-1)
            return
        if self.inner is None:
            mask[row].fill_(-1)
        else:
            self.inner.fill_next_token_bitmask(mask, row)
        if self.phase == "start":
            _allow(mask, row, self.start)


def _allow(mask: torch.Tensor, row: int, token: int) -> None:
    """Set one token's bit (int32 words, bit 31 the sign bit)."""
    bit = 1 << (token & 31)
    if bit >= 2**31:
        bit -= 2**32
    word = token >> 5
    mask[row, word] = int(mask[row, word]) | bit
