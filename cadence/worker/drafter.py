"""The drafter seam: speculative decoding as the model runner sees it.

The runner owns every request's state; a drafter reads it and answers:

    drafter = factory(TargetView(...))      built by the executor's factory, once, before
                                            the KV pool is sized (its K/V counts)
    record_step(ids, layout, hidden, tables)  after each forward pass
    verify(model_out, bitmask, states)      -> one Verdict per sampling request: how many
                                            drafts it accepted and the tokens that yields;
                                            the runner appends them itself
    propose(model_out, accepted, requests)  -> the next drafts per request

Nothing here imports the spec_decode package: the executor hands the runner a factory
(`cadence/spec_decode/decoder.py` makes one), so the worker stays below spec_decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cadence.config import EngineConfig
from cadence.core.scheduler_output import SampledTokens
from cadence.worker.batch_inputs import StepLayout
from cadence.worker.block_tables import BlockTables
from cadence.worker.step_state import ModelOutput, RequestState

# One sampled token's logprob and its top alternatives: (logprob, [(token id, logprob)]).
TokenLogprobs = tuple[float, list[tuple[int, float]]]


@dataclass(frozen=True)
class TargetView:
    """What a drafter may read of the target model and its runner (never write)."""

    config: EngineConfig
    hf_config: object
    model: nn.Module  # the target (EAGLE-3 shares its embedding, reads its hidden states)
    device: torch.device
    dtype: torch.dtype
    block_size: int  # tokens per KV block
    max_model_len: int  # tokens
    max_blocks_per_seq: int  # columns of a block-table row
    vocab_size: int
    eos_token_ids: tuple[int, ...]


@dataclass
class Verdict:
    """One request's verification: the accepted drafts, then the target's own token."""

    num_accepted: int
    tokens: list[int]  # num_accepted drafts + one sampled token
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request wants them


class Drafter(ABC):
    """Guesses tokens for the target to verify, and verifies them."""

    def kv_bytes_per_block(self) -> int:
        """Bytes of its own K/V per pool block (0: it keeps none)."""
        return 0

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        """Its own K/V for `num_blocks` blocks (same block ids as the target's)."""
        return []

    def attention_layers(self) -> list:
        """The attention layers of its own model ([]: none)."""
        return []

    def capture_graphs(self) -> None:
        """CUDA graphs of its own steps, if it has any (called once, on a GPU)."""
        return None

    @abstractmethod
    def record_step(
        self, request_ids: list[str], lay: StepLayout, hidden: torch.Tensor, tables: BlockTables
    ) -> None:
        """The step just launched (its requests in batch order), for propose() to read."""

    @abstractmethod
    def verify(
        self,
        model_out: ModelOutput,
        grammar_bitmask: torch.Tensor | None,
        states: Sequence[RequestState],
    ) -> list[Verdict]:
        """Accept or reject each sampling request's drafts (`states` in `sample_ids` order)."""

    @abstractmethod
    def propose(
        self,
        model_out: ModelOutput,
        accepted: Mapping[str, int],
        requests: Mapping[str, RequestState],
    ) -> dict[str, list[int]]:
        """Drafts for the next step, per request that sampled (after the runner appended
        this step's tokens); `accepted`: drafts each verified request accepted."""


DrafterFactory = Callable[[TargetView], Drafter]


def verify_and_propose(
    drafter: Drafter,
    model_out: ModelOutput,
    grammar_bitmask: torch.Tensor | None,
    requests: dict[str, RequestState],
) -> SampledTokens:
    """A speculative step's sampling: the drafter judges the step's drafts, the accepted
    tokens join their requests' states, then the drafter proposes the next drafts."""
    result = SampledTokens()
    accepted: dict[str, int] = {}
    if model_out.sample_ids:
        states = [requests[rid] for rid in model_out.sample_ids]
        verdicts = drafter.verify(model_out, grammar_bitmask, states)
        for rid, st, verdict in zip(model_out.sample_ids, states, verdicts):
            st.token_ids.extend(verdict.tokens)
            result.sampled[rid] = verdict.tokens[-1]
            if verdict.num_accepted:
                result.accepted_drafts[rid] = verdict.tokens[:-1]
            if verdict.logprobs is not None:
                result.logprobs[rid] = verdict.logprobs
            accepted[rid] = verdict.num_accepted
            if st.prompt_lp is not None and not st.prompt_lp.sent:
                result.prompt_logprobs[rid] = st.prompt_lp.take()
    result.proposals.update(drafter.propose(model_out, accepted, requests))
    return result
