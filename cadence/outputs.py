"""What the offline API returns: one RequestOutput per prompt, one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Wall-clock times (time.time(), seconds) of one request's life."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    # one dict per generated token: {token id: logprob} for the sampled token and the top N
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # With SamplingParams.prompt_logprobs: per prompt token, {token id: logprob} for the
    # prompt token and the top k at its position; None for the first token. None if off.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    embedding: bytes | None = None  # an embedding model's pooled prompt, raw float32 (LLM.embed)


@dataclass
class EmbeddingOutput:
    embedding: list[float]  # pooled, truncated to the dimensions asked for, normalized


@dataclass
class EmbeddingRequestOutput:
    """What LLM.embed returns per prompt."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
