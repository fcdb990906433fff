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

With several API processes (--api-server-count) the bounds hold for the whole server: the
counts live in shared memory (SharedCounts), checked and changed under one lock.
"""

from __future__ import annotations

import contextlib
from contextlib import contextmanager

from cadence.entrypoints.errors import APIError, QueueFull

LOCK_TIMEOUT_S = 5.0  # the shared counts' lock: held microseconds by a live process


class LocalCounts:
    """The counts of a server with one API process."""

    def __init__(self) -> None:
        self.seqs = 0  # sequences in flight
        self.tokens = 0  # prompt tokens queued

    def lock(self):
        return contextlib.nullcontext()


class SharedCounts:
    """The same counts in shared memory, for API processes started by one supervisor
    (made there with its multiprocessing context; handed to each process as it starts)."""

    def __init__(self, mp_context) -> None:
        self._values = mp_context.RawArray("q", 2)
        self._lock = mp_context.Lock()

    @property
    def seqs(self) -> int:
        return self._values[0]

    @seqs.setter
    def seqs(self, n: int) -> None:
        self._values[0] = n

    @property
    def tokens(self) -> int:
        return self._values[1]

    @tokens.setter
    def tokens(self, n: int) -> None:
        self._values[1] = n

    @contextmanager
    def lock(self):
        # A process killed inside the lock (a few microseconds of work) would hold it for
        # ever: give up after a bound instead of freezing this process's event loop.
        if not self._lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise RuntimeError("the admission counts stay locked: an API process died in them")
        try:
            yield
        finally:
            self._lock.release()


class Ticket:
    """An admitted request's hold on the queue; `started(i)` when prompt i's first token
    arrived (its prompt tokens are no longer queued)."""

    def __init__(self, admission: Admission, prompt_tokens: list[int]) -> None:
        self._admission = admission
        self._queued = list(prompt_tokens)

    def started(self, index: int = 0) -> None:
        tokens, self._queued[index] = self._queued[index], 0
        if tokens:
            counts = self._admission.counts
            with counts.lock():
                counts.tokens -= tokens

    def release_all(self) -> None:
        for i in range(len(self._queued)):
            self.started(i)


class Admission:
    def __init__(
        self,
        max_num_seqs: int,
        max_num_waiting: int,
        max_queued_prompt_tokens: int,
        on_reject=None,
        counts: LocalCounts | SharedCounts | None = None,
    ) -> None:
        self.max_seqs_in_flight = max_num_seqs + max_num_waiting
        self.max_queued_prompt_tokens = max_queued_prompt_tokens
        self.counts = counts or LocalCounts()
        self.own_seqs = 0  # of seqs_in_flight: this process's (what its drain waits for)
        self.on_reject = on_reject

    @property
    def seqs_in_flight(self) -> int:
        """Sequences the whole server holds."""
        return self.counts.seqs

    @property
    def queued_prompt_tokens(self) -> int:
        return self.counts.tokens

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
        counts, tokens = self.counts, sum(prompt_tokens)
        with counts.lock():
            seqs, queued = counts.seqs, counts.tokens
            full = seqs + num_seqs > self.max_seqs_in_flight
            crowded = bool(seqs) and queued + tokens > self.max_queued_prompt_tokens
            if not (full or crowded):
                counts.seqs = seqs + num_seqs
                counts.tokens = queued + tokens
        if full:
            self._reject(f"the server is at capacity ({seqs} sequences in flight); retry shortly")
        if crowded:
            self._reject(f"too many prompt tokens queued ({queued}); retry shortly")
        self.own_seqs += num_seqs
        ticket = Ticket(self, prompt_tokens)
        try:
            yield ticket
        finally:
            ticket.release_all()
            self.own_seqs -= num_seqs
            with counts.lock():
                counts.seqs -= num_seqs

    @property
    def idle(self) -> bool:
        """Nothing in flight in this process (what a drain waits for)."""
        return self.own_seqs == 0

    def _reject(self, message: str) -> None:
        if self.on_reject is not None:
            self.on_reject()
        raise QueueFull(message)
