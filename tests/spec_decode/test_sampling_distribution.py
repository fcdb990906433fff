"""With speculation on, sampled text follows the target's distribution: the tiny model's
second token (the first one that comes out of a verification) is drawn many times and
compared, by chi-square, with transformers' distribution for it."""

from __future__ import annotations

import math
from collections import Counter

import torch
from model_helpers import make_prompts

from cadence import LLM, SamplingParams

N = 3000
TEMPERATURE, TOP_K = 0.8, 20


def chi_square_stat(observed: list[int], expected: list[float]) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; bins expecting < 5 draws are pooled."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for o, e in zip(observed, expected):
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp)), len(obs) - 1


def test_second_token_follows_the_target(tiny_model_dir, hf_model):
    target = tiny_model_dir("llama")
    prompt = make_prompts(512, [6], seed=9)[0]
    spec = {"method": "draft_model", "model": target, "num_speculative_tokens": 2}
    llm = LLM(target, dtype="float32", seed=1, speculative_config=spec)
    # max_tokens 3: after the first token there is room for one draft, whose check
    # yields the second token.
    params = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_tokens=3, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompt}] * N, params, use_tqdm=False)
    stats = llm.engine.scheduler.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both verdicts drawn
    pairs = [tuple(o.outputs[0].token_ids) for o in outs]
    # For each first token drawn often enough, the second token's draws against
    # transformers' distribution after it; the statistics of these independent tests add.
    firsts = [t for t, c in Counter(p[0] for p in pairs).items() if c >= 50]
    assert sum(1 for p in pairs if p[0] in firsts) > N // 2
    with torch.inference_mode():
        batch = torch.tensor([prompt + [t] for t in firsts])
        logits = hf_model(target)(batch).logits[:, -1].float() / TEMPERATURE
    kth = logits.topk(TOP_K, dim=-1).values[:, -1:]
    probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
    total_stat, total_df = 0.0, 0
    for t1, p in zip(firsts, probs):
        second = Counter(q[1] for q in pairs if q[0] == t1)
        count = sum(second.values())
        assert all(p[t] > 0 for t in second), "drew a token outside the top-k"
        support = p.nonzero().flatten().tolist()
        stat, df = chi_square_stat(
            [second.get(t, 0) for t in support], [p[t].item() * count for t in support]
        )
        total_stat, total_df = total_stat + stat, total_df + df
    z = 3.09  # 99.9 % quantile of the chi-square (Wilson-Hilferty)
    quantile = total_df * (1 - 2 / (9 * total_df) + z * math.sqrt(2 / (9 * total_df))) ** 3
    assert total_stat < quantile, (total_stat, total_df)
