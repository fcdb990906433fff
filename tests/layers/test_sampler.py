"""The batched sampler's arithmetic on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from cadence.layers.sampler import Sampler, SamplingBatch, apply_token_bitmask


def batch(rows: int, **kw) -> SamplingBatch:
    base = dict(
        temperature=torch.zeros(rows),
        top_k=None,
        top_p=None,
        min_p=None,
        all_greedy=True,
        generators={},
    )
    base.update(kw)
    return SamplingBatch(**base)


def test_greedy_takes_argmax_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert Sampler()(logits, batch(2)).token_ids.tolist() == [1, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_ties_take_the_first_index_in_every_dtype(dtype):
    logits = torch.randn(4, 1000).to(dtype)
    logits[2, 700] = logits[2, 30] = 50.0  # a tie: both best
    tokens = Sampler()(logits, batch(4)).token_ids
    assert tokens.tolist() == logits.float().argmax(-1).tolist() and tokens[2] == 30


def test_penalties_follow_openai_and_ctrl_rules():
    logits = torch.tensor([[2.0, -1.0, 1.0, 0.5]])
    counts = torch.tensor([[2.0, 0.0, 0.0, 1.0]])  # token 0 twice, token 3 once in the output
    seen = torch.tensor([[True, True, False, False]])  # tokens 0, 1 in prompt/output
    b = batch(
        1,
        presence=torch.tensor([0.5]),
        frequency=torch.tensor([0.25]),
        repetition=torch.tensor([2.0]),
        output_counts=counts,
        seen_mask=seen,
    )
    from cadence.layers.sampler import _apply_penalties

    out = _apply_penalties(logits, b)
    # token 0: 2/2 - 0.25*2 - 0.5 = 0; token 1: -1*2 = -2; token 2 untouched; token 3: 0.5 - 0.25 - 0.5
    assert torch.allclose(out, torch.tensor([[0.0, -2.0, 1.0, -0.25]]))
    assert Sampler()(logits, b).token_ids.tolist() == [2]


def test_top_k_top_p_min_p_restrict_the_draw():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(200, 1)
    hot = torch.ones(200)
    only_top2 = Sampler()(
        logits, batch(200, temperature=hot, all_greedy=False, top_k=torch.full((200,), 2))
    )
    assert set(only_top2.token_ids.tolist()) <= {0, 1}
    top_p = Sampler()(
        logits, batch(200, temperature=hot, all_greedy=False, top_p=torch.full((200,), 0.7))
    )
    assert set(top_p.token_ids.tolist()) <= {0, 1}  # 0.5 + 0.3 covers 0.7
    min_p = Sampler()(
        logits, batch(200, temperature=hot, all_greedy=False, min_p=torch.full((200,), 0.5))
    )
    assert set(min_p.token_ids.tolist()) <= {0, 1}  # 0.15 < 0.5 * 0.5
    free = Sampler()(logits, batch(200, temperature=hot, all_greedy=False))
    assert len(set(free.token_ids.tolist())) >= 3


def test_seeded_rows_draw_from_their_own_generator():
    logits = torch.zeros(3, 50)

    def draw(seed_row: int, rows: int):
        gens = {seed_row: torch.Generator().manual_seed(42)}
        b = batch(rows, temperature=torch.ones(rows), all_greedy=False, generators=gens)
        return Sampler()(logits[:rows], b).token_ids[seed_row].item()

    assert draw(0, 1) == draw(2, 3) == draw(1, 2)


def test_a_draw_follows_the_rows_distribution_and_never_picks_zero_mass():
    """The CPU's inverse-CDF draw: frequencies within a few standard errors of the
    probabilities (unnormalised rows, as top-k / min-p leave them), zero-mass tokens
    (the first, the last, between) never drawn, whatever the row's scale."""
    torch.manual_seed(0)
    rows = 40_000
    probs = torch.tensor([[0.0, 0.2, 0.0, 1.2, 0.6, 0.0]]).repeat(rows, 1)
    probs[rows // 2 :] *= 1e-30  # tiny totals draw the same way
    tokens = Sampler().draw(probs, batch(rows, temperature=torch.ones(rows), all_greedy=False))
    counts = torch.bincount(tokens, minlength=6).double() / rows
    want = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0], dtype=torch.float64)
    assert counts[[0, 2, 5]].sum() == 0
    assert ((counts - want).abs() <= 4 * (want * (1 - want) / rows).sqrt() + 1e-9).all()


def test_logprobs_are_raw_log_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    out = Sampler()(logits, batch(1, max_logprobs=2, bias=torch.tensor([[10.0, 0.0, 0.0]])))
    ref = torch.log_softmax(logits, -1)
    assert out.token_ids.tolist() == [0]  # the bias moved the choice...
    assert torch.allclose(out.logprobs, ref[:, 0])  # ...but logprobs are the model's own
    assert out.top_ids.tolist() == [[2, 1]]


def test_token_bitmask_matches_xgrammar_and_blocks_every_cleared_bit():
    xgr = pytest.importorskip("xgrammar", reason="xgrammar is a runtime dependency")
    vocab = 100  # not a multiple of 32: the last word is partly padding
    torch.manual_seed(0)
    logits = torch.randn(3, vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32)
    ours = apply_token_bitmask(logits.clone(), bitmask)
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    assert torch.equal(ours[~torch.isneginf(ours)], logits[~torch.isneginf(ours)])


def test_grammar_mask_wins_over_a_bias_that_bans_everything_it_allows():
    logits = torch.zeros(1, 64)
    only_eos = torch.zeros(1, 2, dtype=torch.int32)
    only_eos[0, 0] = 1 << 5  # token 5 is the only one the grammar allows
    bias = torch.zeros(1, 64)
    bias[0, 5] = float("-inf")  # ... and the min_tokens ban forbids it
    rows = batch(1, bias=bias, allowed_bitmask=only_eos)
    assert Sampler()(logits, rows).token_ids.tolist() == [5]
