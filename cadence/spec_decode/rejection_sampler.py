"""Exact verification of draft tokens: the output follows the target model's distribution.

A request that verifies k drafts d_1..d_k has k + 1 logits rows: row j (0-based) is the
target's distribution p_j for the token after the request's tokens and d_1..d_j. Every
row is processed as the plain sampler would (bias, penalties, grammar mask, temperature,
top-k / top-p / min-p), so p_j is exactly what sampling without speculation would use.

Our proposers draft greedily, so the draft distribution q_j is a point mass on d_j, and the
standard speculative-sampling rule (accept with min(1, p/q), else sample the residual
max(0, p - q)) becomes:

    accept d_{j+1} with probability p_j(d_{j+1})
    at the first rejection j: sample from p_j with d_{j+1} removed (renormalised)
    all k accepted: sample a bonus token from p_k

Greedy rows accept d_{j+1} iff it is argmax p_j, and the first mismatch (or the bonus) is
the argmax: the same tokens as decoding without speculation, one at a time.

Everything per row runs on the device, for all rows at once; only the accepted prefix of
each request is cut on the host from two small [rows] vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadence.layers.sampler import Sampler, SamplerOutput, SamplingBatch, _argmax, with_logprobs


@dataclass
class VerifiedRows:
    """Per logits row, on the device."""

    accepted: torch.Tensor  # [R] bool: the draft at this row is accepted (False: bonus rows)
    out: SamplerOutput  # [R] the token this row yields (the draft if accepted, else the
    # target's pick), with raw logprobs where wanted


def verify_rows(
    sampler: Sampler, logits: torch.Tensor, batch: SamplingBatch, draft_ids: torch.Tensor
) -> VerifiedRows:
    """`draft_ids` [R] int64: the draft each row checks (row j of a request: d_{j+1}),
    -1 for a request's last row (nothing to check: its token is the bonus)."""
    processed, raw_logprobs = sampler.process(logits, batch)
    has_draft = draft_ids >= 0
    safe_drafts = draft_ids.clamp(min=0)
    greedy_ids = _argmax(processed)
    accepted = has_draft & (greedy_ids == safe_drafts)
    picked = greedy_ids
    if not batch.all_greedy:
        probs = sampler.probs(processed, batch)
        total = probs.sum(dim=-1)
        p_draft = probs.gather(1, safe_drafts[:, None]).squeeze(1) / total
        uniform = torch.rand(len(draft_ids), device=logits.device)
        for row, gen in batch.generators.items():
            uniform[row] = torch.rand(1, generator=gen, device=logits.device)
        # The residual: p without the draft (the exponential race ignores the scale).
        residual = probs.scatter(1, safe_drafts[:, None], 0.0)
        residual = torch.where(has_draft[:, None], residual, probs)
        recovered = sampler.draw(residual, batch)
        sampled_rows = batch.temperature > 0
        accepted = torch.where(sampled_rows, has_draft & (uniform < p_draft), accepted)
        picked = torch.where(sampled_rows, recovered, greedy_ids)
    tokens = torch.where(accepted, safe_drafts, picked)
    out = with_logprobs(SamplerOutput(tokens), raw_logprobs, batch.max_logprobs)
    return VerifiedRows(accepted, out)


def accepted_prefix(accepted: list[bool], tokens: list[int], num_drafts: list[int]):
    """Per request (rows back to back, 1 + num_drafts[i] each): (number of drafts
    accepted, the tokens it yields: those drafts then the target's token)."""
    out = []
    row = 0
    for k in num_drafts:
        a = 0
        while a < k and accepted[row + a]:
            a += 1
        out.append((a, tokens[row : row + a + 1]))
        row += k + 1
    return out
