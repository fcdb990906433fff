"""Admission control: a bounded queue instead of one that grows until everyone times out.

A request is *queued* from admission until its first token arrives. Past either bound
(queued requests, queued prompt tokens) a new request gets 429 with Retry-After at once.
A lone request is always admitted, however long its prompt (the context limit bounds it).
"""

from __future__ import annotations

from contextlib import contextmanager


class QueueFull(Exception):
    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    def __init__(
        self, max_num_seqs: int, max_num_waiting: int, max_queued_prompt_tokens: int, on_reject=None
    ) -> None:
        self.max_in_flight = max_num_seqs + max_num_waiting
        self.max_num_waiting = max_num_waiting
        self.max_queued_prompt_tokens = max_queued_prompt_tokens
        self.in_flight = 0
        self.queued_prompt_tokens = 0
        self.on_reject = on_reject

    @contextmanager
    def admit(self, num_prompt_tokens: int):
        if self.in_flight >= self.max_in_flight:
            self._reject(
                f"the server is at capacity ({self.in_flight} requests in flight); retry shortly"
            )
        if (
            self.in_flight
            and self.queued_prompt_tokens + num_prompt_tokens > self.max_queued_prompt_tokens
        ):
            self._reject(
                f"too many prompt tokens queued ({self.queued_prompt_tokens}); retry shortly"
            )
        self.in_flight += 1
        self.queued_prompt_tokens += num_prompt_tokens
        started = [False]

        def started_cb() -> None:
            if not started[0]:
                started[0] = True
                self.queued_prompt_tokens -= num_prompt_tokens

        try:
            yield started_cb
        finally:
            started_cb()
            self.in_flight -= 1

    def _reject(self, message: str) -> None:
        if self.on_reject is not None:
            self.on_reject()
        raise QueueFull(message)
