"""Per-head q/k LayerNorms, a weight per head: Cohere's `use_qk_norm` (one [heads, head_dim]
tensor in the checkpoint) and StableLM's `qk_layernorm` (a LayerNorm module per head, stacked
on load). The tiny models' norm weights are drawn at random, head by head, so a head's
weight landing on another head shows in the tokens."""

from __future__ import annotations

import pytest
import torch
from model_helpers import WINDOW, _zoo_config, hf_greedy, make_prompts

from cadence import LLM, SamplingParams

FAMILIES = {
    "cohere": lambda: _zoo_config(
        "CohereConfig", "CohereForCausalLM", logit_scale=0.5, use_qk_norm=True
    ),
    "stablelm": lambda: _zoo_config("StableLmConfig", "StableLmForCausalLM", qk_layernorm=True),
}


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_per_head_qk_norms_equal_transformers(kind, tmp_path):
    config, cls = FAMILIES[kind]()
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_norm" in name or "k_norm" in name or "layernorm.norms" in name:
                param.uniform_(0.2, 2.0)  # every head its own scale
    model.save_pretrained(tmp_path)
    prompts = make_prompts(512, [3, 2 * WINDOW + 5, 40], seed=5)
    expected = [hf_greedy(model, p, 10) for p in prompts]
    llm = LLM(str(tmp_path), dtype="float32", max_num_batched_tokens=16)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == expected
    attn = llm.engine.runner.driver.model.layers[0].self_attn
    assert tuple(attn.q_norm.weight.shape) == (config.num_attention_heads, attn.head_dim)
