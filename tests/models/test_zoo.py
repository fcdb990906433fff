"""Every dense family, built tiny by transformers with its distinctive options on (sliding
windows, soft-caps, sandwich and post norms, partial, interleaved or absent rotary,
multipliers, fused checkpoints, biases), gives transformers' greedy tokens in float32: in
mixed batches with prompts longer than the window and chunked prefill, under preemption,
and again on a warm prefix cache; logprobs match transformers' (which shows the logit
transformations: soft-caps, scales)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import WINDOW, ZOO, hf_greedy, make_prompts
from transformers import AutoConfig

from cadence import LLM, SamplingParams
from cadence.models.decoder import layer_window

LENGTHS = [3, 2 * WINDOW + 5, 17, 40, WINDOW]
NEW_TOKENS = 12


def _sliding_layers(path: str) -> str:
    """ "all", "some" (interleaved local and global layers: a KV group each kind) or "none"."""
    config = AutoConfig.from_pretrained(path)
    slides = [bool(layer_window(config, i)) for i in range(config.num_hidden_layers)]
    return "all" if all(slides) else "some" if any(slides) else "none"


@pytest.mark.parametrize("kind", sorted(ZOO))
def test_greedy_equals_transformers_chunked_preempted_and_cached(kind, tiny_model_dir, hf_model):
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, LENGTHS, seed=11)
    model = hf_model(path)
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3)
    requests = [{"prompt_token_ids": p} for p in prompts]
    # A 16-token budget chunks the long prompts beside decoding requests; 24 blocks of 4
    # tokens cannot hold all five requests at full length, so some are preempted. Where
    # every layer slides, requests release the blocks behind their window, so it takes a
    # pool of 9 to make them preempt (and one of 9 keeps too little cached for hits).
    # Interleaved local and global layers (three layers: a KV group each, so a block is
    # one layer's) hold every block in the global group and a window in the others: 36.
    sliding = _sliding_layers(path)
    kw = dict(dtype="float32", block_size=4, max_num_batched_tokens=16, check_kv_integrity=True)
    pool = {"all": 9, "some": 36, "none": 24}[sliding]
    llm = LLM(path, num_gpu_blocks_override=pool, **kw)
    assert len(llm.engine.kv.groups) == (3 if sliding == "some" else 1)
    got = llm.generate(requests, params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert (llm.engine.kv.num_window_releases > 0) == (sliding != "none")
    assert [o.outputs[0].token_ids for o in got] == expected
    # Again: prompts whose blocks are still cached start from them (released blocks too).
    if sliding != "none":
        llm = LLM(path, num_gpu_blocks_override=192, **kw)
        llm.generate(requests, params, use_tqdm=False)
    again = llm.generate(requests, params, use_tqdm=False)
    assert any(o.num_cached_tokens > 0 for o in again)
    assert [o.outputs[0].token_ids for o in again] == expected
    # The logprobs of each generated token, against transformers' log-softmax.
    out = got[3].outputs[0]
    with torch.inference_mode():
        logits = model(torch.tensor([prompts[3] + out.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    for step, (token, step_lps) in enumerate(zip(out.token_ids, out.logprobs)):
        assert step_lps[token] == pytest.approx(
            ref[len(prompts[3]) - 1 + step, token].item(), abs=1e-4
        )


def test_interleaved_layers_share_the_pools_memory_by_kv_group(tiny_model_dir):
    """Gemma 2's tiny model: local, global, local. Three groups of one layer each, whose
    blocks all live in one tensor; with the radix cache (no holes allowed) one group."""
    path = tiny_model_dir("gemma2")
    llm = LLM(path, dtype="float32", num_gpu_blocks_override=16)
    runner = llm.engine.runner.driver
    layers = runner.model.attention_layers()
    assert [layer.kv_group for layer in layers] == [1, 0, 2]
    assert len(runner.kv_caches) == 1
    assert all(layer.kv_cache is runner.kv_caches[0] for layer in layers)
    assert [g.window for g in llm.engine.kv.groups] == [None, WINDOW, WINDOW]
    radix = LLM(path, dtype="float32", num_gpu_blocks_override=16, prefix_cache="radix")
    assert len(radix.engine.runner.driver.kv_caches) == 3
    assert [g.window for g in radix.engine.kv.groups] == [None]
