"""Admission control: a bounded queue instead of one that grows until everyone times out.

Admission counts the work, not the requests: a request holds one *sequence* per prompt and
sample (`n`, `best_of`), and its prompts' tokens (counted once per prompt: samples share the
prompt's KV blocks). Bounds:

  sequences in flight     <= max_num_seqs + max_num_waiting
  prompt tokens queued    <= max_queued_prompt_tokens  (until each prompt's first token)

Past either bound a new request gets 429 with Retry-After at once. A request larger than a
bound on its own could never be admitted: it gets a 400 that says so, not a 429 to retry.
The whole request is admitted at once, before any response byte goes out, so a streamed
multi-prompt completion is never refused halfway through its stream.
"""

from __future__ import annotations

from contextlib import contextmanager

from cadence.entrypoints.errors import APIError, QueueFull


class Ticket:
    """An admitted request's hold on the queue; `started(i)` when prompt i's first token
    arrived (its prompt tokens are no longer queued)."""

    def __init__(self, admission: Admission, prompt_tokens: list[int]) -> None:
        self._admission = admission
        self._queued = list(prompt_tokens)

    def started(self, index: int = 0) -> None:
        tokens, self._queued[index] = self._queued[index], 0
        self._admission.queued_prompt_tokens -= tokens

    def release_all(self) -> None:
        for i in range(len(self._queued)):
            self.started(i)


class Admission:
    def __init__(
        self, max_num_seqs: int, max_num_waiting: int, max_queued_prompt_tokens: int, on_reject=None
    ) -> None:
        self.max_seqs_in_flight = max_num_seqs + max_num_waiting
        self.max_queued_prompt_tokens = max_queued_prompt_tokens
        self.seqs_in_flight = 0
        self.queued_prompt_tokens = 0
        self.on_reject = on_reject

    def check_size(self, num_seqs: int, prompt_tokens: list[int]) -> None:
        """400 for a request no empty server could take."""
        if num_seqs > self.max_seqs_in_flight:
            raise APIError(
                f"the request needs {num_seqs} sequences (prompts x n / best_of); this server "
                f"holds at most {self.max_seqs_in_flight} at once (--max-num-seqs + "
                "--max-num-waiting)",
                param="n",
                code="request_too_large",
            )
        if sum(prompt_tokens) > self.max_queued_prompt_tokens:
            raise APIError(
                f"the request's prompts hold {sum(prompt_tokens)} tokens; this server queues at "
                f"most {self.max_queued_prompt_tokens} (--max-queued-prompt-tokens)",
                param="prompt",
                code="request_too_large",
            )

    @contextmanager
    def admit(self, num_seqs: int, prompt_tokens: list[int]):
        """Hold `num_seqs` sequences and the prompts' tokens while the request runs; yields
        a Ticket. Raises APIError (400, too large ever) or QueueFull (429, full now)."""
        self.check_size(num_seqs, prompt_tokens)
        if self.seqs_in_flight + num_seqs > self.max_seqs_in_flight:
            self._reject(
                f"the server is at capacity ({self.seqs_in_flight} sequences in flight); "
                "retry shortly"
            )
        if (
            self.seqs_in_flight
            and self.queued_prompt_tokens + sum(prompt_tokens) > self.max_queued_prompt_tokens
        ):
            self._reject(
                f"too many prompt tokens queued ({self.queued_prompt_tokens}); retry shortly"
            )
        self.seqs_in_flight += num_seqs
        self.queued_prompt_tokens += sum(prompt_tokens)
        ticket = Ticket(self, prompt_tokens)
        try:
            yield ticket
        finally:
            ticket.release_all()
            self.seqs_in_flight -= num_seqs

    @property
    def idle(self) -> bool:
        return self.seqs_in_flight == 0

    def _reject(self, message: str) -> None:
        if self.on_reject is not None:
            self.on_reject()
        raise QueueFull(message)
