"""Speculative decoding behind the worker's `Drafter` seam: verify this step's drafts,
then propose the next.

The model runner builds a verify step like any other: a request with drafts d_1..d_k runs
its last sampled token and the k drafts as k + 1 query tokens, and its logits rows are the
last k + 1 (ModelOutput.drafts says how many per request). Then, in place of sampling, the
runner asks this decoder:

    verify(model_out, bitmask, states)
        sampling inputs per row: row j sees the request's tokens plus d_1..d_j (penalties
                                 and the min_tokens ban count the drafts before it)
        verify_rows(...)         accept / reject every row on the device (exact)
        accepted_prefix(...)     per request: the accepted drafts, then the target's token
    (the runner appends those tokens)
    propose(model_out, accepted, requests)
        proposer.propose(step)   the next drafts, from what is now known

Steps with speculation are synchronous (each step's tokens are read back before the next
is scheduled): the next drafts depend on how many of this step's were accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from cadence.config import SpeculativeConfig
from cadence.layers.sampler import Sampler
from cadence.sampling_params import SamplingParams
from cadence.spec_decode.proposer import Proposer, StepRecord
from cadence.spec_decode.rejection_sampler import accepted_prefix, verify_rows
from cadence.worker.batch_inputs import StepLayout
from cadence.worker.block_tables import BlockTables
from cadence.worker.drafter import Drafter, DrafterFactory, TargetView, Verdict
from cadence.worker.sampling_inputs import build_sampling_batch
from cadence.worker.step_state import ModelOutput, RequestState
from cadence.worker.transfer import to_device


@dataclass
class _RowState:
    """A request as sampling sees it at one draft position (its tokens plus the drafts
    before that position)."""

    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator | None


def make_proposer(spec: SpeculativeConfig, target: TargetView) -> Proposer:
    k = spec.num_speculative_tokens
    if spec.method == "ngram":
        from cadence.spec_decode.ngram import NgramProposer

        return NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        from cadence.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(k, spec.model, target)
    from cadence.spec_decode.eagle3 import Eagle3Proposer

    return Eagle3Proposer(k, spec.model, target)


def drafter_factory(spec: SpeculativeConfig | None) -> DrafterFactory | None:
    """What the executor hands each rank's runner (None: no speculative decoding)."""
    if spec is None:
        return None
    return lambda target: SpecDecoder(spec, target)


class SpecDecoder(Drafter):
    def __init__(self, spec: SpeculativeConfig, target: TargetView) -> None:
        self.config = spec
        self.target = target
        self.sampler = Sampler()
        self.proposer = make_proposer(spec, target)
        if self.proposer.needs_aux_hidden:  # (before any CUDA graph is captured)
            target.model.keep_aux_hidden(self.proposer.aux_layer_ids)
        self._step: tuple[list[str], StepLayout, torch.Tensor, BlockTables] | None = None

    def kv_bytes_per_block(self) -> int:
        return self.proposer.kv_bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        return self.proposer.allocate_kv_cache(num_blocks)

    def attention_layers(self) -> list:
        return self.proposer.attention_layers()

    def capture_graphs(self) -> None:
        self.proposer.capture_graphs()

    def record_step(
        self, request_ids: list[str], lay: StepLayout, hidden: torch.Tensor, tables: BlockTables
    ) -> None:
        self._step = (request_ids, lay, hidden, tables)

    @torch.inference_mode()
    def verify(
        self,
        model_out: ModelOutput,
        bitmask: torch.Tensor | None,
        states: Sequence[RequestState],
    ) -> list[Verdict]:
        """Accept or reject every request's drafts: the tokens each yields."""
        target = self.target
        dev = target.device
        rows_in: list[_RowState] = []
        draft_rows: list[int] = []
        for st, drafts in zip(states, model_out.drafts):
            for j in range(len(drafts) + 1):
                if j and st.params.needs_penalties:  # penalties count every token
                    tokens, n_prompt = st.token_ids + drafts[:j], st.num_prompt_tokens
                else:  # only the output's length matters (min_tokens): no context copy
                    tokens, n_prompt = st.token_ids, st.num_prompt_tokens - j
                rows_in.append(_RowState(tokens, n_prompt, st.params, st.generator))
            draft_rows += [*drafts, -1]
        batch = build_sampling_batch(rows_in, dev, target.vocab_size, target.eos_token_ids)
        if bitmask is not None:
            batch.allowed_bitmask = to_device(bitmask, dev)
        drafts_d = to_device(torch.tensor(draft_rows, dtype=torch.int64), dev)
        rows = verify_rows(self.sampler, model_out.logits, batch, drafts_d)
        # The step's one read-back: per row, accepted and its token (and logprobs).
        out = rows.out
        flags, tokens = torch.stack([rows.accepted.long(), out.token_ids]).tolist()
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        top_ids = out.top_ids.tolist() if out.top_ids is not None else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        num_drafts = [len(d) for d in model_out.drafts]
        verdicts: list[Verdict] = []
        row = 0
        for st, k_drafts, (a, new) in zip(
            states, num_drafts, accepted_prefix(flags, tokens, num_drafts)
        ):
            k = st.params.logprobs
            logprobs = None
            if k is not None and lps is not None:
                logprobs = [
                    (lps[r], list(zip(top_ids[r][:k], top_lps[r][:k])) if k > 0 else [])
                    for r in range(row, row + a + 1)
                ]
            verdicts.append(Verdict(a, new, logprobs))
            row += k_drafts + 1
        return verdicts

    @torch.inference_mode()
    def propose(
        self,
        model_out: ModelOutput,
        accepted: Mapping[str, int],
        requests: Mapping[str, RequestState],
    ) -> dict[str, list[int]]:
        if self._step is None:
            return {}
        request_ids, lay, hidden, tables = self._step
        self._step = None
        drafts = dict(zip(model_out.sample_ids, model_out.drafts or []))
        valid_ends, sampled, token_ids, caps = [], [], [], []
        for i, rid in enumerate(request_ids):
            st = requests[rid]
            end = int(lay.starts[i] + lay.query_lens[i])
            if rid in accepted:  # rejected drafts' positions are not the request's
                end -= len(drafts[rid]) - accepted[rid]
            valid_ends.append(end)
            sampled.append(rid in accepted)
            token_ids.append(st.token_ids)
            caps.append(self._max_drafts(st))
        limit = self.config.disable_by_batch_size
        if limit is not None and len(request_ids) >= limit:
            caps = [0] * len(caps)  # a draft model still catches up: its K/V stays valid
        aux = self.target.model.aux_hidden if self.proposer.needs_aux_hidden else None
        step = StepRecord(request_ids, lay, hidden, aux, valid_ends, sampled, token_ids, tables)
        return {
            rid: proposal
            for rid, proposal in zip(request_ids, self.proposer.propose(step, caps))
            if proposal
        }

    def _max_drafts(self, st: RequestState) -> int:
        """Drafts worth proposing: the next step yields up to drafts + 1 tokens, within
        max_tokens and the context."""
        cap = self.config.num_speculative_tokens
        cap = min(cap, self.target.max_model_len - len(st.token_ids) - 1)
        max_tokens = st.params.max_tokens
        if max_tokens is not None:
            cap = min(cap, max_tokens - (len(st.token_ids) - st.num_prompt_tokens) - 1)
        return max(cap, 0)
