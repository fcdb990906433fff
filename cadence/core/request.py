"""The engine core's view of one request: its tokens, how many have KV, and its status.

Token bookkeeping, in tokens (not blocks):

    all_token_ids = prompt_token_ids + output_token_ids      (len = num_tokens)
    [0, num_computed_tokens)   have K/V in the cache
    [num_computed_tokens, num_tokens)  still to run through the model

Decoding, exactly one token is not computed (the one sampled last step). While a prompt is
being prefilled in chunks, many are, and no token is sampled until the last chunk. Tokens a
grammar forces (jump-forward) join output_token_ids without being sampled: the next step
computes them with the last sampled one, like a short prefill chunk. The worker learns of
them from `unsent_token_ids` (it appends sampled tokens itself).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from cadence.lora_request import LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_INVALID = 6  # ended, but its output breaks its schema (structured/checked.py)

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_INVALID: "error",  # (vLLM's name for a request that failed)
}


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        arrival_time: float | None = None,
        priority: int = 0,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        lora: LoRARequest | None = None,
        images: list[ImageInput] | None = None,
        whole_images: bool = False,
    ) -> None:
        self.request_id = request_id
        self.lora = lora  # the adapter it runs with (None: the base model)
        # Its images, in prompt order: the prefix cache keys their spans by content hash.
        self.images: list[ImageInput] = images or []
        # Prompt spans [start, end) a prefill chunk takes whole or not at all (images whose
        # tokens attend to each other both ways, `whole_images`), in order.
        self.whole_spans: list[tuple[int, int]] = (
            [(image.offset, image.end) for image in self.images] if whole_images else []
        )
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_prompt_tokens = 0  # prefix-cache hit at first schedule, for stats
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.enqueue_step = 0  # scheduler step at which it last joined the waiting queue
        self.stop_reason: int | None = None  # the stop token id that ended it, if any
        self.unsent_token_ids: list[int] = []  # forced tokens the worker has not been sent
        # Speculative decoding: tokens a proposer guessed to follow all_token_ids. The next
        # step verifies them (they are scheduled like any token); update() keeps those the
        # target model agrees with. Never hashed into the prefix cache.
        self.spec_token_ids: list[int] = []
        # Async scheduling: tokens sampled by a step still in flight (0 or 1). The next
        # step may already compute on them; their ids arrive with the update.
        self.num_placeholders = 0
        # Disaggregated serving: its prompt's K/V was loaded from (or offered by) another
        # engine once already; never again (after a preemption it recomputes).
        self.remote_prefill_done = False
        # Chained hashes of every full block of all_token_ids, extended as tokens arrive.
        self._block_hasher = block_hasher
        self.block_hashes: list[bytes] = []
        self.update_block_hashes()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def fit_chunk(self, start: int, num_new: int, most: int) -> int:
        """How many of `num_new` prompt tokens from position `start` to run, so that the
        chunk does not end inside a whole span: cut back to the span's start, or for a
        chunk that starts at or inside the span, carried on to its end where `most` tokens
        allow it (else 0: not this step). Nothing to run (num_new <= 0) stays nothing."""
        if num_new <= 0:
            return num_new
        end = start + num_new
        for lo, hi in self.whole_spans:
            if lo < end < hi:
                if lo > start:
                    return lo - start
                return hi - start if hi - start <= most else 0
        return num_new

    def append_output_token(self, token_id: int, sampled: bool = True) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if not sampled:
            self.unsent_token_ids.append(token_id)
        self.update_block_hashes()

    def take_unsent_tokens(self) -> list[int]:
        out, self.unsent_token_ids = self.unsent_token_ids, []
        return out

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
