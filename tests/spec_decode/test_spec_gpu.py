"""Speculative decoding on a CUDA device: verify steps replay the mixed-step CUDA graphs
(with EAGLE-3 too: the graphs keep the hidden states it reads), a draft model and an
EAGLE-3 head replay their own decode and catch-up graphs, and float32 greedy output is transformers' for every
proposer. Skipped without CUDA (run them on the GPU machine)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import hf_greedy, make_prompts
from spec_helpers import eagle3_head, noisy_copy

from cadence import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NEW_TOKENS = 32


def prompts() -> list[list[int]]:
    spans = make_prompts(512, [6, 11, 20], seed=4)
    return make_prompts(512, [3, 17, 40, 90], seed=3) + [s + s + s[:3] for s in spans]


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle3", "identical_draft"])
def test_float32_greedy_equals_transformers(method, tiny_model_dir, hf_model, tmp_path):
    path = tiny_model_dir("llama")
    spec = {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
        "draft_model": {
            "model": noisy_copy(path, tmp_path / "noisy", 0.3),
            "num_speculative_tokens": 3,
        },
        "eagle3": {
            "method": "eagle3",
            "model": eagle3_head(tmp_path / "e3"),
            "num_speculative_tokens": 2,
        },
        "identical_draft": {"model": path, "num_speculative_tokens": 4},
    }[method]
    llm = LLM(
        path, device="cuda", dtype="float32", num_gpu_blocks_override=512, speculative_config=spec
    )
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts()], params, use_tqdm=False)
    model = hf_model(path)
    assert [o.outputs[0].token_ids for o in outs] == [
        hf_greedy(model, p, NEW_TOKENS) for p in prompts()
    ]
    runner = llm.engine.runner.driver
    stats = llm.engine.scheduler.spec_stats
    assert stats.num_verifications > 0
    assert runner.mixed_graphs.num_replays > 0  # verify steps replayed graphs
    if method != "ngram":  # the proposer's own steps replayed graphs too
        proposer = runner.drafter.proposer
        assert proposer.graphs.num_replays > 0 and proposer.mixed.num_replays > 0
    if method == "identical_draft":
        assert stats.num_accepted_tokens == stats.num_draft_tokens
