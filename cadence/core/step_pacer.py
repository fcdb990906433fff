"""How many prompt tokens a step may carry beside decodes, from the engine's own step times.

While requests decode, each of their next tokens waits for the whole step: a step that also
computes P prompt tokens takes about d + c * P (d: a decode-only step at the batch now, c:
what one prompt token adds). To keep every stream's gap within `factor` decode-only steps
(its ITL tail within about factor x its TPOT), the pacer caps P at

    (factor - 1) * d / c

with d and c the intercept and slope of a least-squares line through the recent steps
that carried decodes (step time against prompt tokens, each step's weight decaying by DECAY
a step), so the cap follows the model, the GPU and the batch instead of a fixed token count.
Decode-only steps pin the intercept, mixed steps the slope; while every step is mixed at
one size (no spread to fit a slope on) the last slope is kept and the intercept still
follows the batch, with the lag of a moving fit (a batch that grows while the prompt
tokens change reads partly as a dearer token: the cap then errs low). A fixed cost F of
any mixed step shows in the slope at that size, and the cap settles where a mixed step
takes factor x d all the same.

Until both are known, cap() is None and the static bound applies
(`max_prefill_tokens_while_decoding`). A step's duration runs from its launch (or the end of
the step before it, if later: with async scheduling step N + 1 is queued while step N runs)
to its tokens read back. Steps without decodes are not timed: nobody waits on them.
"""

from __future__ import annotations

from collections import deque

DECAY = 0.95  # each older step's weight in the fit, per step (about the last 20 steps)
# A slope is fitted only on a spread of prompt tokens (standard deviation) of at least this
# share of their mean and MIN_TOKENS / 4: steps of one size, a faded cluster of older steps
# (at another batch), and a few tokens' difference (timer jitter, graph buckets) say more
# about the batch or the noise than about a prompt token's price.
MIN_SPREAD = 0.25
# The cap never goes below this: fewer prompt tokens a step would not use a GPU well, and
# would starve prefill where a step with any prompt tokens costs much more than a decode
# step whatever their number (the CPU's matmuls switch paths: 2.5 went to 16 tokens there,
# TTFT p50 0.23 -> 4.3 s; benchmarks/step_pacer_cpu.sh).
MIN_TOKENS = 256


class StepPacer:
    def __init__(self, factor: float) -> None:
        if not 1 < factor < float("inf"):
            raise ValueError(f"mixed_step_factor must be > 1 and finite (or 0: off), got {factor}")
        self.factor = factor
        self.decode_s: float | None = None  # d: the fit's intercept
        self.per_token_s: float | None = None  # c: its slope
        # weighted sums over steps with decodes: weight, P, P^2, seconds, P x seconds
        self._sums = (0.0, 0.0, 0.0, 0.0, 0.0)
        self._decode_only = (0.0, 0.0)  # weight, seconds: d before any slope is fitted
        self._launches: deque[float] = deque()  # (perf_counter) of steps not yet resolved
        self._last_end = 0.0
        self._last_cap: int | None = None  # while the fit says nothing sound, the last cap

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
        p = float(prompt_tokens)
        if not prompt_tokens:
            w0, t0 = (DECAY * v for v in self._decode_only)
            self._decode_only = (w0 + 1, t0 + duration)
        w, sp, spp, st, spt = (DECAY * v for v in self._sums)
        self._sums = (w + 1, sp + p, spp + p * p, st + duration, spt + p * duration)
        self._fit()

    def _fit(self) -> None:
        w, sp, spp, st, spt = self._sums
        mean_p, mean_t = sp / w, st / w
        spread = spp / w - mean_p * mean_p
        if spread >= max((MIN_TOKENS / 4) ** 2, (MIN_SPREAD * mean_p) ** 2):
            slope = (spt / w - mean_p * mean_t) / spread
            self.per_token_s = slope if slope > 0 else self.per_token_s
        if self.per_token_s is not None:
            self.decode_s = mean_t - self.per_token_s * mean_p
        elif self._decode_only[0]:  # (no price yet: the decode-only steps' mean)
            self.decode_s = self._decode_only[1] / self._decode_only[0]

    def cap(self) -> int | None:
        """Prompt tokens a step beside decodes may carry now; None before any estimate
        (a fit whose intercept is not a positive time keeps the last cap)."""
        if self.per_token_s and self.decode_s and self.decode_s > 0:
            paced = round((self.factor - 1) * self.decode_s / self.per_token_s)
            self._last_cap = max(MIN_TOKENS, paced)
        return self._last_cap


def prefill_cap(static_bound: int | None, pacer: StepPacer | None) -> int:
    """Prompt tokens a step may take beside decodes now (0: no bound but the budget): the
    static bound (`max_prefill_tokens_while_decoding`), or the pacer's cap if lower."""
    paced = pacer.cap() if pacer else None
    if paced is None:
        return static_bound or 0
    return min(static_bound, paced) if static_bound else paced
