"""Greedy float32 output with speculation on is token for token the output with it off,
for every proposer, under chunked prefill, preemption, prefix-cache hits (hash and radix),
async scheduling and logprobs; a draft identical to the target accepts every token."""

from __future__ import annotations

import pytest
from model_helpers import make_prompts
from spec_helpers import eagle3_head, noisy_copy

from cadence import LLM, SamplingParams

NEW_TOKENS = 24


def prompts() -> list[list[int]]:
    # Random prompts, and prompts that repeat a span (n-gram lookup finds matches there).
    plain = make_prompts(512, [3, 17, 40], seed=3)
    spans = make_prompts(512, [6, 11, 20], seed=4)
    return plain + [s + s + s[:3] for s in spans]


@pytest.fixture(scope="module")
def drafts(tiny_model_dir, tmp_path_factory):
    """method -> its speculative_config over the tiny llama."""
    target = tiny_model_dir("llama")
    tmp = tmp_path_factory.mktemp("drafts")
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
        "draft_model": {
            "method": "draft_model",
            "model": noisy_copy(target, tmp / "noisy", noise=0.3),
            "num_speculative_tokens": 3,
        },
        "eagle3": {
            "method": "eagle3",
            "model": eagle3_head(tmp / "eagle3"),
            "num_speculative_tokens": 2,
        },
    }


def generate(path, spec=None, logprobs=None, repeat=1, **kw) -> tuple[LLM, list]:
    kw.setdefault("dtype", "float32")
    kw.setdefault("check_kv_integrity", True)
    kw.setdefault("num_gpu_blocks_override", 256)
    llm = LLM(path, speculative_config=spec, **kw)
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=logprobs
    )
    batch = [{"prompt_token_ids": p} for p in prompts()]
    outs = []
    for _ in range(repeat):
        outs = llm.generate(batch, params, use_tqdm=False)
    return llm, [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    _, outs = generate(tiny_model_dir("llama"), logprobs=2)
    return outs


CONDITIONS = {
    "default": {},
    "chunked-prefill": {"max_num_batched_tokens": 8},
    "preemption": {"num_gpu_blocks_override": 24, "block_size": 4},
    "prefix-cache-hits": {"repeat": 2},
    "radix-cache": {"prefix_cache": "radix", "repeat": 2},
    "async-scheduling": {"async_scheduling": True},
}


@pytest.mark.parametrize("condition", CONDITIONS)
@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle3"])
def test_speculation_changes_no_greedy_token(method, condition, tiny_model_dir, drafts, reference):
    kw = CONDITIONS[condition]
    llm, outs = generate(tiny_model_dir("llama"), drafts[method], **kw)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    stats = llm.engine.scheduler.spec_stats
    assert stats.num_verifications > 0, "no draft was ever verified"
    if condition == "preemption":
        assert llm.engine.scheduler.num_preemptions > 0
    if "repeat" in kw:
        assert llm.engine.kv.stats.hits > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_both_verdicts_happen(method, tiny_model_dir, drafts):
    """The equality above covers accepted and rejected drafts alike."""
    llm, _ = generate(tiny_model_dir("llama"), drafts[method])
    stats = llm.engine.scheduler.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_logprobs_are_the_targets(tiny_model_dir, drafts, reference):
    _, outs = generate(tiny_model_dir("llama"), drafts["draft_model"], logprobs=2)
    for got, ref in zip(outs, reference):
        assert got.token_ids == ref.token_ids
        for g, r in zip(got.logprobs, ref.logprobs):
            assert g.keys() == r.keys()
            for tok in g:
                assert g[tok] == pytest.approx(r[tok], abs=1e-4)


def test_an_identical_draft_accepts_every_greedy_token(tiny_model_dir, reference):
    target = tiny_model_dir("llama")
    spec = {"method": "draft_model", "model": target, "num_speculative_tokens": 4}
    llm, outs = generate(target, spec)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    stats = llm.engine.scheduler.spec_stats
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    # Each verification yields its drafts plus one: 4 drafts, or fewer where max_tokens cut.
    assert stats.mean_acceptance_length > 3.5


def test_penalties_see_the_drafts_before_them(tiny_model_dir, drafts):
    """Row j of a verification counts drafts 1..j in its penalties: greedy output with
    repetition, frequency and presence penalties and a logit bias is unchanged."""
    target = tiny_model_dir("llama")
    params = SamplingParams(
        temperature=0.0,
        max_tokens=NEW_TOKENS,
        ignore_eos=True,
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        presence_penalty=0.2,
        logit_bias={7: 3.0},
    )
    batch = [{"prompt_token_ids": p} for p in prompts()]
    outs = {}
    for method in (None, "ngram", "draft_model"):
        spec = drafts[method] if method else None
        llm = LLM(target, dtype="float32", speculative_config=spec)
        outs[method] = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    assert outs["ngram"] == outs[None]
    assert outs["draft_model"] == outs[None]


def test_no_drafts_at_or_above_disable_by_batch_size(tiny_model_dir, drafts, reference):
    spec = {**drafts["draft_model"], "disable_by_batch_size": len(prompts())}
    llm, outs = generate(tiny_model_dir("llama"), spec)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert llm.engine.scheduler.spec_stats.num_verifications == 0


def test_prompt_logprobs_are_unchanged(tiny_model_dir, drafts):
    target = tiny_model_dir("llama")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=2)
    batch = [{"prompt_token_ids": p} for p in prompts()]
    outs = {}
    for method in (None, "ngram"):
        llm = LLM(target, dtype="float32", speculative_config=drafts[method] if method else None)
        outs[method] = llm.generate(batch, params, use_tqdm=False)
    for got, want in zip(outs["ngram"], outs[None]):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert len(got.prompt_logprobs) == len(want.prompt_logprobs)
        for g, w in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
            assert g.keys() == w.keys()
            assert all(g[t] == pytest.approx(w[t], abs=1e-4) for t in g)


def test_min_tokens_counts_the_drafts_before_each_row(tiny_model_dir, drafts):
    """EOS is biased to be the argmax and banned for the first 12 tokens: every request
    stops at exactly 13 tokens, with speculation as without (row j of a verification knows
    it is j tokens further into the output)."""
    target = tiny_model_dir("llama")
    params = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=12, logit_bias={2: 30.0})
    batch = [{"prompt_token_ids": p} for p in prompts()]
    outs = {}
    for method in (None, "draft_model"):
        spec = {**drafts[method], "model": target} if method else None  # drafts agree
        llm = LLM(target, dtype="float32", speculative_config=spec)
        outs[method] = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
        if method:
            assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0
    assert outs["draft_model"] == outs[None]
    assert all(len(t) == 13 and t[-1] == 2 for t in outs[None])
