"""The scheduler with speculative decoding, model-free: draft tokens are scheduled tokens
(budget, KV slots plus the lookahead), rejected ones roll back, and the output is the
fake model's whatever the acceptance, the budget, the pool or the preemptions."""

from __future__ import annotations

import random

import pytest
from scheduler_helpers import (
    BS,
    add_all,
    blocks_for,
    check_all_free,
    check_at_rest,
    expected_output,
    fake_token,
    make_requests,
)

from cadence.config import SchedulerConfig
from cadence.core.kv_cache import KVCacheManager
from cadence.core.scheduler import Scheduler
from cadence.core.scheduler_output import SampledTokens

K = 3


def make_spec_scheduler(num_blocks=64, budget=64, max_num_seqs=16) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, enable_caching=True)
    config = SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=1024
    )
    return Scheduler(config, kv, num_lookahead_tokens=K)


def spec_step(sched: Scheduler, rng: random.Random, hit_rate: float) -> dict:
    """One step: the fake target accepts a draft iff it is the fake model's token there;
    the fake proposer guesses right with probability `hit_rate`."""
    out = sched.schedule()
    assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
    sampled, accepted, proposals = {}, {}, {}
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        drafts = out.spec_token_ids.get(rid, [])
        assert len(drafts) <= K
        # Drafts follow exactly one known token (the one sampled last).
        assert not drafts or req.num_tokens - req.num_computed_tokens == 1
        # Blocks cover computed + scheduled tokens plus the proposer's lookahead slots.
        held = len(sched.kv.get_block_ids(rid))
        assert held >= blocks_for(req.num_computed_tokens + n + K, BS)
        if req.num_computed_tokens + n - len(drafts) != req.num_tokens:
            continue  # a prefill chunk short of the prompt's end
        pos = req.num_tokens
        acc = []
        for d in drafts:
            if d != fake_token(rid, pos):
                break
            acc.append(d)
            pos += 1
        accepted[rid] = acc
        sampled[rid] = fake_token(rid, pos)
        proposals[rid] = [
            fake_token(rid, pos + 1 + j) if rng.random() < hit_rate else 7 for j in range(K)
        ]
    updates = sched.update(
        out, SampledTokens(sampled=sampled, accepted_drafts=accepted, proposals=proposals)
    )
    check_at_rest(sched)
    for req in sched.running:
        # Every computed token is a known one: rejected drafts were rolled back.
        assert req.num_computed_tokens == req.num_tokens - 1 or req.num_computed_tokens < (
            req.num_prompt_tokens
        )
    return {u.request_id: u for u in updates}


@pytest.mark.parametrize(
    "budget,num_blocks,hit_rate",
    [(64, 64, 0.8), (64, 64, 0.0), (64, 64, 1.0), (7, 64, 0.7), (64, 14, 0.7)],
    ids=["mixed", "all-rejected", "all-accepted", "tight-budget", "preempting"],
)
def test_output_is_the_models_whatever_the_acceptance(budget, num_blocks, hit_rate):
    sched = make_spec_scheduler(num_blocks=num_blocks, budget=budget)
    reqs = make_requests(6, prompt_len=9, max_tokens=17)
    add_all(sched, reqs)
    outputs = {r.request_id: [] for r in reqs}
    rng = random.Random(0)
    for _ in range(500):
        if not sched.has_unfinished_requests():
            break
        for rid, up in spec_step(sched, rng, hit_rate).items():
            outputs[rid] += up.new_token_ids
    assert not sched.has_unfinished_requests()
    for req in reqs:
        assert outputs[req.request_id] == expected_output(req)
    stats = sched.spec_stats
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    if hit_rate == 1.0:
        assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    if hit_rate == 0.0:
        assert stats.num_accepted_tokens == 0 and stats.num_draft_tokens > 0
    if num_blocks == 14:
        assert sched.num_preemptions > 0
    check_all_free(sched)


def test_drafts_never_run_past_max_tokens():
    sched = make_spec_scheduler()
    (req,) = make_requests(1, prompt_len=5, max_tokens=3)
    add_all(sched, [req])
    rng = random.Random(1)
    spec_step(sched, rng, 1.0)  # prefill: samples token 1, proposes K
    out = sched.schedule()
    # Two tokens left to produce: one draft plus the target's own token.
    assert out.spec_token_ids[req.request_id] == [fake_token(req.request_id, 6)]


def test_only_accepted_tokens_are_hashed():
    """A block filled partly by rejected drafts gets no prefix-cache hash until its
    tokens are known; a later request sharing the accepted prefix hits it."""
    sched = make_spec_scheduler()
    (req,) = make_requests(1, prompt_len=BS, max_tokens=2 * BS)
    add_all(sched, [req])
    rng = random.Random(2)
    while sched.has_unfinished_requests():
        spec_step(sched, rng, 0.5)
        for h in sched.kv.cache.cached:
            assert h in req.block_hashes  # hashes name known tokens only
    check_all_free(sched)
