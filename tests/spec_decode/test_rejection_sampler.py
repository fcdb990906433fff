"""The rejection sampler: greedy rows accept exactly the argmax's agreement; sampled rows
yield tokens distributed as the target's (processed) distribution, checked by chi-square
over many draws, whether the draft is likely, unlikely or filtered out."""

from __future__ import annotations

import math

import pytest
import torch

from cadence.layers.sampler import Sampler, SamplingBatch
from cadence.spec_decode.rejection_sampler import accepted_prefix, verify_rows

V = 8


def batch(rows: int, temperature=1.0, top_p=None, max_logprobs=None) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.full((rows,), temperature),
        top_k=None,
        top_p=None if top_p is None else torch.full((rows,), top_p),
        min_p=None,
        all_greedy=temperature == 0,
        generators={},
        max_logprobs=max_logprobs,
    )


def target_probs(logits: torch.Tensor, temperature: float, top_p=None) -> torch.Tensor:
    b = batch(1, temperature, top_p)
    p = Sampler().probs(logits[None].clone(), b)[0]
    return p / p.sum()


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Pearson's test at the 0.1 % level (Wilson-Hilferty quantile), bins with p > 0."""
    n = counts.sum().item()
    live = probs > 0
    assert counts[~live].sum() == 0, "a token with zero probability was drawn"
    expected = probs[live] * n
    stat = ((counts[live] - expected) ** 2 / expected).sum().item()
    df = int(live.sum()) - 1
    z = 3.09  # the 99.9th percentile of N(0, 1)
    quantile = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < quantile


def test_greedy_rows_accept_while_the_draft_is_the_argmax():
    logits = torch.zeros(5, V)
    best = [3, 1, 4, 1, 5]
    logits[torch.arange(5), best] = 5.0
    # Request A: drafts 3 (right), 2 (wrong) -> rows 0, 1, 2; request B: draft 1 (right)
    # -> rows 3, 4 (its bonus is row 4).
    drafts = torch.tensor([3, 2, -1, 1, -1])
    rows = verify_rows(Sampler(), logits, batch(5, temperature=0), drafts)
    assert rows.accepted.tolist() == [True, False, False, True, False]
    verdicts = accepted_prefix(rows.accepted.tolist(), rows.out.token_ids.tolist(), [2, 1])
    assert verdicts == [(1, [3, 1]), (1, [1, 5])]


@pytest.mark.parametrize(
    "draft,temperature,top_p",
    [(2, 1.0, None), (5, 0.7, None), (0, 1.0, 0.8)],
    ids=["likely-draft", "unlikely-draft", "draft-filtered-by-top-p"],
)
def test_sampled_tokens_follow_the_target(draft, temperature, top_p):
    torch.manual_seed(0)
    logits = torch.tensor([-3.0, 0.5, 1.5, 0.0, -1.0, -0.5, 1.0, -2.0])
    p = target_probs(logits, temperature, top_p)
    n = 40_000
    # n requests of one draft each: rows (check the draft, bonus) back to back.
    row_logits = logits.repeat(2 * n, 1)
    drafts = torch.tensor([draft, -1]).repeat(n)
    rows = verify_rows(Sampler(), row_logits, batch(2 * n, temperature, top_p), drafts)
    first = rows.out.token_ids.view(n, 2)[:, 0]
    assert chi_square_ok(torch.bincount(first, minlength=V).float(), p)
    accepted = rows.accepted.view(n, 2)[:, 0]
    assert accepted.float().mean().item() == pytest.approx(p[draft].item(), abs=0.01)
    # After an accepted draft, the bonus token is a fresh draw from the next row's p.
    if accepted.any():
        bonus = rows.out.token_ids.view(n, 2)[accepted, 1]
        assert chi_square_ok(torch.bincount(bonus, minlength=V).float(), p)


def test_logprobs_are_the_raw_targets():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    drafts = torch.tensor([int(logits[0].argmax()), -1, -1])
    rows = verify_rows(Sampler(), logits.clone(), batch(3, 0.0, max_logprobs=2), drafts)
    raw = torch.log_softmax(logits, dim=-1)
    tokens = rows.out.token_ids
    assert torch.allclose(rows.out.logprobs, raw.gather(1, tokens[:, None]).squeeze(1))
