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

from cadence.spec_decode.proposer import Proposer, StepRecord


def lookup(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed an earlier occurrence of the last n tokens.

    O(context) per request: candidate matches are the earlier positions of the last token,
    narrowed one token further back at a time (a match of n tokens contains one of n - 1)."""
    length = len(tokens)
    # Earlier occurrences of the last token: where a match would end (never the last one).
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    matched = {1: ends}
    for n in range(2, min(n_max, length - 1) + 1):
        prev = matched[n - 1]
        prev = prev[prev >= n - 1]
        matched[n] = prev[tokens[prev - (n - 1)] == tokens[length - n]]
        if len(matched[n]) == 0:
            break
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        found = matched.get(n)
        if found is None or len(found) == 0:
            continue
        follow = length - 1 - found  # tokens after each match
        full = found[follow >= k]
        end = int(full[-1]) if len(full) else int(found[0])
        return tokens[end + 1 : end + 1 + k].tolist()
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
