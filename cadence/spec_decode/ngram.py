"""N-gram (prompt lookup) proposals: if the last n tokens occurred earlier in the request,
guess that what followed them then follows now.

For n from prompt_lookup_max down to prompt_lookup_min, look for earlier occurrences of the
request's last n tokens (prompt and output alike); the first n with a match wins. Among
matches, the latest one with k tokens after it is taken (recent context predicts best), or
else the one with the most tokens after it. No model and no K/V: editing, extraction and
code refactoring copy long spans of their input, which this finds for free.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cadence.spec_decode.proposer import Proposer, StepRecord


def lookup(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of the last n tokens."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        # Windows starting at 0 .. length - n - 1: every occurrence but the suffix itself.
        windows = sliding_window_view(tokens[: length - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts) == 0:
            continue
        follow = length - (starts + n)  # tokens after each match
        full = starts[follow >= k]
        start = int(full[-1]) if len(full) else int(starts[0])
        return tokens[start + n : start + n + k].tolist()
    return []


class NgramProposer(Proposer):
    def __init__(self, k: int, n_min: int, n_max: int) -> None:
        super().__init__(k)
        self.n_min = n_min
        self.n_max = n_max

    def propose(self, step: StepRecord, max_drafts: list[int]) -> list[list[int]]:
        out = []
        for tokens, sampled, cap in zip(step.token_ids, step.sampled, max_drafts):
            if not sampled or cap <= 0:
                out.append([])
                continue
            arr = np.asarray(tokens, dtype=np.int64)
            out.append(lookup(arr, min(self.k, cap), self.n_min, self.n_max))
        return out
