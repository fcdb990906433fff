"""Sampling parameters, end to end through the engine on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import hf_greedy, make_prompts

from cadence import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir("llama"), dtype="float32", num_gpu_blocks_override=512, block_size=4)


def gen(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


PROMPTS = make_prompts(512, [6, 13, 21, 8, 30, 4], seed=11)


def test_seed_gives_same_text_whatever_shares_the_batch(llm):
    params = SamplingParams(
        temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=24, ignore_eos=True
    )
    alone = gen(llm, [PROMPTS[0]], params)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.3, max_tokens=17, ignore_eos=True)
    mixed = (
        llm.generate(
            [{"prompt_token_ids": p} for p in PROMPTS],
            [params] + [others] * (len(PROMPTS) - 1),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert alone == mixed
    other_seed = gen(llm, [PROMPTS[0]], SamplingParams(**{**params.__dict__, "seed": 99}))[0]
    assert other_seed.outputs[0].token_ids != alone


def test_n_samples_share_the_prompt_and_differ(llm):
    prompt = make_prompts(512, [40], seed=5)[0]
    hits_before = llm.engine.kv.stats.hits
    out = gen(
        llm, [prompt], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    )[0]
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert all(len(o.token_ids) == 12 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # Siblings after the first reuse the prompt's full blocks (40 tokens = 9 full blocks of 4).
    assert llm.engine.kv.stats.hits - hits_before >= 3 * 36


def test_n_greedy_samples_all_equal_transformers(llm, tiny_model_dir, hf_model):
    prompt = PROMPTS[4]
    out = gen(llm, [prompt], SamplingParams(n=3, temperature=0.0, max_tokens=16, ignore_eos=True))[
        0
    ]
    ref = hf_greedy(hf_model(tiny_model_dir("llama")), prompt, 16)
    assert [o.token_ids for o in out.outputs] == [ref] * 3


def test_max_tokens_and_min_tokens(llm):
    eos = llm.engine.eos_token_ids[0]
    # A huge bias makes EOS the only choice; min_tokens still holds it off.
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5, logit_bias={eos: 100.0})
    out = gen(llm, [PROMPTS[1]], params)[0].outputs[0]
    assert len(out.token_ids) == 6 and out.token_ids[-1] == eos
    assert out.finish_reason == "stop" and out.stop_reason == eos
    out = gen(llm, [PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True))[
        0
    ].outputs[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


def test_stop_token_ids_end_the_request(llm):
    greedy = gen(
        llm, [PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )[0]
    tokens = greedy.outputs[0].token_ids
    stop_at = tokens[5]
    out = gen(
        llm,
        [PROMPTS[2]],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_at]),
    )
    got = out[0].outputs[0]
    assert got.token_ids == tokens[: tokens.index(stop_at) + 1]
    assert got.finish_reason == "stop" and got.stop_reason == stop_at


def test_logit_bias_forces_a_token(llm):
    out = gen(
        llm,
        [PROMPTS[0]],
        SamplingParams(
            temperature=0.8, seed=3, max_tokens=5, ignore_eos=True, logit_bias={42: 100.0}
        ),
    )
    assert out[0].outputs[0].token_ids == [42] * 5


def test_penalties_change_greedy_output_away_from_repeats(llm):
    base = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    plain = gen(llm, [PROMPTS[3]], base)[0].outputs[0].token_ids
    for field in ("presence_penalty", "frequency_penalty"):
        params = SamplingParams(**{**base.__dict__, field: 2.0})
        penalized = gen(llm, [PROMPTS[3]], params)[0].outputs[0].token_ids
        assert len(set(penalized)) >= len(set(plain))
    rep = (
        gen(llm, [PROMPTS[3]], SamplingParams(**{**base.__dict__, "repetition_penalty": 5.0}))[0]
        .outputs[0]
        .token_ids
    )
    # A strong repetition penalty avoids every prompt token it can.
    assert len(set(rep) & set(PROMPTS[3])) <= len(set(plain) & set(PROMPTS[3]))
    assert rep != plain or not (set(plain) & set(PROMPTS[3]))


def test_top_k_1_and_tiny_top_p_are_greedy(llm):
    greedy = (
        gen(llm, [PROMPTS[5]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
        .outputs[0]
        .token_ids
    )
    k1 = (
        gen(
            llm,
            [PROMPTS[5]],
            SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True),
        )[0]
        .outputs[0]
        .token_ids
    )
    p0 = (
        gen(
            llm,
            [PROMPTS[5]],
            SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=12, ignore_eos=True),
        )[0]
        .outputs[0]
        .token_ids
    )
    minp = (
        gen(
            llm,
            [PROMPTS[5]],
            SamplingParams(temperature=1.5, min_p=1.0, max_tokens=12, ignore_eos=True),
        )[0]
        .outputs[0]
        .token_ids
    )
    assert greedy == k1 == p0 == minp


def test_logprobs_of_sampled_and_top_tokens(llm):
    out = gen(
        llm,
        [PROMPTS[0]],
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3),
    )[0].outputs[0]
    assert len(out.logprobs) == 6
    total = 0.0
    for tok, lps in zip(out.token_ids, out.logprobs):
        assert tok in lps and len(lps) == 3  # greedy: the sampled token is the top one
        assert lps[tok] == max(lps.values()) and lps[tok] <= 0.0
        total += lps[tok]
    assert math.isclose(out.cumulative_logprob, total, rel_tol=1e-6)
    zero = gen(
        llm,
        [PROMPTS[0]],
        SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=0),
    )[0].outputs[0]
    assert all(len(d) == 1 for d in zero.logprobs)


def test_outputs_carry_timings(llm):
    out = gen(llm, [PROMPTS[0]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    m = out.metrics
    assert out.finished
    assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time


def test_penalties_equal_a_reference_loop(llm, tiny_model_dir, hf_model):
    """Greedy under repetition (prompt + output), presence and frequency (output only)
    penalties, in a batch with an unpenalised request, equals a transformers loop applying
    the same formulas to its float32 logits, token for token."""
    model = hf_model(tiny_model_dir("llama"))
    rep, presence, frequency = 1.4, 0.7, 0.3

    def reference(prompt, steps):
        ids = list(prompt)
        out = []
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[torch.tensor(ids)] = True
            logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
            counts = torch.bincount(torch.tensor(out, dtype=torch.int64), minlength=logits.numel())
            logits = logits - frequency * counts - presence * (counts > 0).float()
            out.append(int(logits.argmax()))
            ids.append(out[-1])
        return out

    penalised = SamplingParams(
        temperature=0,
        max_tokens=10,
        ignore_eos=True,
        repetition_penalty=rep,
        presence_penalty=presence,
        frequency_penalty=frequency,
    )
    plain = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    # Prompts that end in the model's own greedy continuation, which it tends to repeat:
    # the penalties on prompt tokens then decide the argmax.
    prompts = [p + hf_greedy(model, p, 12) for p in PROMPTS[:3]]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [penalised, plain, penalised],
        use_tqdm=False,
    )
    with torch.inference_mode():
        assert outs[0].outputs[0].token_ids == reference(prompts[0], 10)
        assert outs[2].outputs[0].token_ids == reference(prompts[2], 10)
    assert outs[1].outputs[0].token_ids == hf_greedy(model, prompts[1], 10)
