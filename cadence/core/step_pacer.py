"""How many prompt tokens a step may carry beside decodes, from the engine's own step times.

While requests decode, each of their next tokens waits for the whole step: a step that also
computes P prompt tokens takes about d + c * P (d: a decode-only step now, c: what one
prompt token adds). To keep every stream's gap within `factor` decode-only steps (its ITL
tail within about factor x its TPOT), the pacer caps P at

    (factor - 1) * d / c

with both estimated as the engine runs, so the cap follows the model, the GPU and the batch
instead of a fixed token count:

    d   a moving average of decode-only steps' durations
    c   a moving average of mixed steps' time past d, over one of their prompt tokens (a
        ratio of averages: a step of a few prompt tokens says little on its own)

Until both are known, cap() is None and the static bound applies
(`max_prefill_tokens_while_decoding`). A step's duration runs from its launch (or the end of
the step before it, if later: with async scheduling step N + 1 is queued while step N runs)
to its tokens read back. Steps without decodes are not timed: nobody waits on them.
"""

from __future__ import annotations

from collections import deque

SMOOTHING = 0.1  # weight of the newest step in each moving average
# The cap never goes below this: fewer prompt tokens a step would not use a GPU well, and
# would starve prefill where a step with any prompt tokens costs much more than a decode
# step whatever their number (the CPU's matmuls switch paths: 2.5 went to 16 tokens there,
# TTFT p50 0.23 -> 4.3 s; benchmarks/step_pacer_cpu.sh).
MIN_TOKENS = 256


class StepPacer:
    def __init__(self, factor: float) -> None:
        if factor <= 1:
            raise ValueError(f"mixed_step_factor must be > 1 (or 0: off), got {factor}")
        self.factor = factor
        self.decode_s: float | None = None  # d
        self._excess_s: float | None = None  # mixed steps' time past d
        self._prompt_tokens: float | None = None  # mixed steps' prompt tokens
        self._launches: deque[float] = deque()  # (perf_counter) of steps not yet resolved
        self._last_end = 0.0

    def launched(self, at: float) -> None:
        """A step that will be resolved (its tokens read back) was launched at `at`."""
        self._launches.append(at)

    def forget_launches(self) -> None:
        """The launched steps will not be resolved (a step failed)."""
        self._launches.clear()

    def resolved(self, prompt_tokens: int, decode_seqs: int, at: float) -> None:
        """The oldest launched step's tokens were read back at `at`; it computed
        `prompt_tokens` prompt tokens beside `decode_seqs` decoding sequences."""
        start = self._launches.popleft() if self._launches else at
        duration = at - max(start, self._last_end)
        self._last_end = at
        if not decode_seqs or duration <= 0:
            return
        if not prompt_tokens:
            self.decode_s = _average(self.decode_s, duration)
        elif self.decode_s is not None:
            self._excess_s = _average(self._excess_s, max(0.0, duration - self.decode_s))
            self._prompt_tokens = _average(self._prompt_tokens, float(prompt_tokens))

    def cap(self) -> int | None:
        """Prompt tokens a step beside decodes may carry now; None before any estimate."""
        if self.decode_s is None or not self._excess_s or not self._prompt_tokens:
            return None
        per_token_s = self._excess_s / self._prompt_tokens
        return max(MIN_TOKENS, round((self.factor - 1) * self.decode_s / per_token_s))


def prefill_cap(static_bound: int | None, pacer: StepPacer | None) -> int:
    """Prompt tokens a step may take beside decodes now (0: no bound but the budget): the
    static bound (`max_prefill_tokens_while_decoding`), or the pacer's cap if lower."""
    paced = pacer.cap() if pacer else None
    if paced is None:
        return static_bound or 0
    return min(static_bound, paced) if static_bound else paced


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else mean + SMOOTHING * (value - mean)
