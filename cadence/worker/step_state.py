"""What the runner keeps per request, and what one step hands from the forward pass to
sampling: shared by the runner, the executors and the drafter (which read, never write)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cadence.layers.sampler import SamplerOutput
from cadence.multimodal.inputs import ImageInput
from cadence.sampling_params import SamplingParams
from cadence.worker.pooling import PoolingState
from cadence.worker.prompt_logprobs import PromptLogprobsState


@dataclass
class RequestState:
    """A running request as the runner knows it. Only the runner writes it."""

    token_ids: list[int]  # prompt + output, including the token sampled last
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator | None
    row: int  # its row in BlockTables
    num_computed_tokens: int
    num_pending: int = 0  # sampled by a step whose ids have not been read back yet
    prompt_lp: PromptLogprobsState | None = None  # wants prompt logprobs
    pool: PoolingState | None = None  # an embedding model's request: pools its prompt
    images: list[ImageInput] = field(default_factory=list)  # its images' spans and pixels
    mrope: tuple | None = None  # M-RoPE: (prompt positions [3, n], later offset), once


@dataclass
class PendingSample:
    """A step's sampling, launched but not read back (async scheduling reads it a step
    later, while the next forward pass runs)."""

    sample_ids: list[str]
    states: list[RequestState]  # the requests sampled (an id may be reused meanwhile)
    out: SamplerOutput  # on the host (CPU device), or pinned host copies being filled
    ready: torch.cuda.Event | None  # passed: the copies have landed


@dataclass
class ModelOutput:
    """One step's forward pass, before sampling."""

    sample_ids: list[str]  # requests that sample this step, in row order
    # [rows, vocab] on the device: one row per sampling request, or with speculative
    # decoding 1 + len(drafts[i]) rows for request i (its drafts' positions, then the next)
    logits: torch.Tensor | None
    drafts: list[list[int]] | None = None  # speculative decoding: drafts per request
    # perf_counter() when the inputs were ready and the forward pass began (the step
    # timeline's prepare | forward boundary); None if the step ran no forward pass
    forward_start: float | None = None
