"""What passes between the scheduler, the worker and the API server each step: plain types.

SchedulerOutput    schedule() -> the worker: deltas (new requests in full, cached ones as
                   new blocks), tokens per request, draft tokens to verify
SampledTokens      the worker -> update(): sampled tokens, accepted drafts, proposals
RequestUpdate      update() -> the API server (msgspec: also the wire format)
SchedulerStats / SpecDecodeStats   counters for /metrics
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from cadence.core.request import Request
from cadence.lora_request import LoRALoad, LoRARequest
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the worker has not seen: everything it needs, once."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # The block ids of the KV groups after the first, as block_ids holds the first's (a
    # model with interleaved local and global layers; empty with one group).
    group_block_ids: list[list[int]] = field(default_factory=list)
    lora: LoRARequest | None = None  # the adapter it runs with (None: the base model)
    images: list[ImageInput] = field(default_factory=list)  # (Request.images)


@dataclass
class CachedRequestData:
    """A request the worker already holds: only what changed."""

    request_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    resumed: bool  # back from preemption: new_block_ids replace the old ones
    new_token_ids: list[int] = field(default_factory=list)  # forced by a grammar, unsampled
    new_group_block_ids: list[list[int]] = field(default_factory=list)  # (as block_ids)


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    # request id -> tokens to run this step, in batch order (new and cached interleaved)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # request id -> draft tokens to verify (speculative decoding), the last of its tokens
    # in num_scheduled_tokens; requests without drafts are absent
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    # Of those, sequences past their prompt (a token each, plus drafts) and their tokens:
    # the rest are prompt tokens (prefill chunks, recomputation after preemption).
    num_decode_seqs: int = 0
    num_decode_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # since the last step
    # adapters the worker writes into slots before this step (LoRA)
    lora_loads: list[LoRALoad] = field(default_factory=list)
    # The Request each scheduled id named. With async scheduling a request can finish while
    # a later step that includes it is in flight, and its id can be reused by then: update()
    # must not hand that step's token to the newcomer.
    requests: dict[str, Request] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class SampledTokens:
    """What the worker returns for one step: a token per request that reached its end.
    Only the worker writes it (GrammarVerdicts carries what the grammars add)."""

    sampled: dict[str, int] = field(default_factory=dict)
    # Speculative decoding: request id -> its draft tokens the target accepted; they come
    # before sampled[rid] (the target's own token after them)
    accepted_drafts: dict[str, list[int]] = field(default_factory=dict)
    # request id -> draft tokens proposed for the next step
    proposals: dict[str, list[int]] = field(default_factory=dict)
    # request id -> per new token (accepted drafts, then the sampled one): (its logprob,
    # [(token id, logprob)] of the top N)
    logprobs: dict[str, list[tuple[float, list[tuple[int, float]]]]] = field(default_factory=dict)
    # request id -> one entry per prompt token (None for the first), with its first token
    prompt_logprobs: dict[str, list[tuple[float, list[tuple[int, float]]] | None]] = field(
        default_factory=dict
    )
    # request id -> an embedding model's pooled vector (float32 bytes), with its first token
    embeddings: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class GrammarVerdicts:
    """What the structured-output grammars said of one step's tokens (cadence/structured/
    gate.py writes it, the scheduler reads it)."""

    # request id -> tokens the grammar forces after its new ones (jump-forward)
    forced: dict[str, list[int]] = field(default_factory=dict)
    done: frozenset[str] | set[str] = frozenset()  # grammar complete: the request stops
    # request id -> its proposed drafts cut to what the grammar allows (replace the worker's)
    proposals: dict[str, list[int]] = field(default_factory=dict)
    # run-time schema checks found a value the grammar let through that breaks the schema
    # (a dead end): the request ends now, and not as a success (also in `done`)
    violated: frozenset[str] | set[str] = frozenset()


NO_VERDICTS = GrammarVerdicts()


class RequestUpdate(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request's news after a step. Also the wire format to the API server."""

    request_id: str
    new_token_ids: list[int]
    # per new token: (sampled token's logprob, [(token id, logprob), ...] of the top N)
    new_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while running
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    first_scheduled_time: float | None = None  # set on a request's first update
    # Prompt logprobs (SamplingParams.prompt_logprobs), on the update that carries the first
    # token, for the whole prompt: per prompt token (the prompt token's logprob, [(token id,
    # logprob)] of the top k at its position); None for the first token, which has none.
    new_prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] | None = None
    # An embedding model's pooled vector of the prompt (raw float32 bytes), with the first token
    embedding: bytes | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0  # of which preempted, waiting to be recomputed:
    num_preempted: int = 0
    kv_usage: float = 0.0
    kv_blocks_cached: int = 0  # free blocks that still hold a cached prefix
    num_preemptions: int = 0  # since start
    prefix_queries: int = 0  # tokens, since start
    prefix_hits: int = 0
    prefix_requests: int = 0  # requests looked up, since start
    prefix_hit_requests: int = 0  # of which hit at least one block
    prefix_evictions: int = 0  # cached blocks reused for other data, since start
    spec: SpecDecodeStats | None = None  # speculative decoding, when on
    kv_transfer: KVTransferStats | None = None  # disaggregated serving (--kv-role), when on
    lora: LoRAStats | None = None  # LoRA adapters (--enable-lora), when on
    prefill_cap: int = 0  # prompt tokens a step may take beside decodes now (0: no bound)
    decode_step_ms: float = 0.0  # the step pacer's decode-only step (0: none, or no reading)


@dataclass
class LoRAStats:
    running: dict[str, int] = field(default_factory=dict)  # adapter name -> sequences
    waiting: dict[str, int] = field(default_factory=dict)
    slot_loads: int = 0  # adapters written into a slot, since start


@dataclass
class KVTransferStats:
    """Prompt K/V moved between engines since start (remote_prefill.py keeps them)."""

    num_loads: int = 0  # decode side: loads that ended with the K/V here
    num_loaded_tokens: int = 0
    num_failed_loads: int = 0  # (those requests computed their prompt themselves)
    load_seconds: float = 0.0  # start of each load to its end as the scheduler saw it
    num_saved_tokens: int = 0  # prefill side: prompt tokens staged for a decode engine


@dataclass
class SpecDecodeStats:
    """Speculative decoding's tallies since start (one verification = one request's drafts
    checked in one step)."""

    num_verifications: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # accepted_per_position[i]: verifications whose draft i (0-based) was accepted
    accepted_per_position: list[int] = field(default_factory=list)
    # acceptance_lengths[n]: verifications that produced n tokens (accepted drafts + 1)
    acceptance_lengths: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_verifications += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        grow = num_drafts - len(self.accepted_per_position)
        self.accepted_per_position.extend([0] * max(grow, 0))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        grow = num_accepted + 2 - len(self.acceptance_lengths)
        self.acceptance_lengths.extend([0] * max(grow, 0))
        self.acceptance_lengths[num_accepted + 1] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification (accepted drafts + the target's own)."""
        n = self.num_verifications
        return (self.num_accepted_tokens + n) / n if n else 0.0
