"""Prompt logprobs (`SamplingParams.prompt_logprobs`): each prompt token's logprob and the top
k at its position equal transformers' float32 log-softmax, however the prompt is scheduled:
in chunks, beside requests that do not want them, over a prefix the cache already holds,
after a preemption, with async scheduling. The first prompt token has none (None)."""

from __future__ import annotations

import logging
import re

import msgspec
import pytest
import torch
from model_helpers import ARCHS, make_prompts

from cadence import LLM, SamplingParams
from cadence.core.scheduler_output import RequestUpdate

TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_model_dir, hf_model):
    """reference(kind, prompt) -> transformers' [len(prompt), vocab] float32 log-softmax."""

    @torch.inference_mode()
    def get(kind: str, prompt: list[int]) -> torch.Tensor:
        logits = hf_model(tiny_model_dir(kind))(torch.tensor([prompt])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    return get


def assert_matches(plps, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    """One entry per prompt token: None first, then {token: logprob} holding the prompt
    token's own logprob (from the position before it) and the top k there."""
    assert plps is not None and len(plps) == len(prompt)
    assert plps[0] is None
    for j in range(1, len(prompt)):
        entry, row = plps[j], ref[j - 1]
        assert isinstance(entry, dict), j
        assert entry[prompt[j]] == pytest.approx(row[prompt[j]].item(), abs=TOL), j
        top = row.topk(k).indices.tolist() if k else []
        assert set(entry) == set(top) | {prompt[j]}, j
        for tok, lp in entry.items():
            assert lp == pytest.approx(row[tok].item(), abs=TOL), (j, tok)


def generate(llm: LLM, prompts, params) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, **kw)


@pytest.mark.parametrize("kind", ARCHS)
def test_prompt_logprobs_match_transformers(kind, tiny_model_dir, reference):
    prompt = make_prompts(512, [29], seed=11)[0]
    llm = LLM(tiny_model_dir(kind), dtype="float32", num_gpu_blocks_override=128)
    (out,) = generate(llm, [prompt], greedy(prompt_logprobs=5))
    assert_matches(out.prompt_logprobs, prompt, reference(kind, prompt), 5)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_chunked_prefill_beside_requests_that_do_not_want_them(
    async_scheduling, tiny_model_dir, reference
):
    """A budget of 8 tokens splits every prompt into chunks that share steps with other
    requests' chunks and decodes; k differs per request (0, 3, 20), and a request without
    prompt logprobs gets none and the same tokens as when it runs alone."""
    path = tiny_model_dir("llama")
    prompts = make_prompts(512, [27, 9, 40, 2, 17], seed=5)
    wanted = [3, None, 20, 0, None]
    kw = dict(dtype="float32", num_gpu_blocks_override=256, check_kv_integrity=True)
    llm = LLM(path, max_num_batched_tokens=8, async_scheduling=async_scheduling, **kw)
    outs = generate(llm, prompts, [greedy(prompt_logprobs=k) for k in wanted])
    alone = generate(LLM(path, **kw), prompts, greedy())
    for prompt, k, out, ref_out in zip(prompts, wanted, outs, alone):
        assert out.outputs[0].token_ids == ref_out.outputs[0].token_ids
        if k is None:
            assert out.prompt_logprobs is None
        else:
            assert_matches(out.prompt_logprobs, prompt, reference("llama", prompt), k)


def test_a_one_token_prompt_has_only_the_first_entry(tiny_model_dir):
    llm = LLM(tiny_model_dir("llama"), dtype="float32", num_gpu_blocks_override=64)
    (out,) = generate(llm, [[42]], greedy(prompt_logprobs=2))
    assert out.prompt_logprobs == [None]


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_a_cached_prefix_is_recomputed_for_its_logprobs(prefix_cache, tiny_model_dir, reference):
    """A prompt whose blocks the cache holds takes no hit when it wants prompt logprobs
    (cached positions produce no logits), yet still fills the cache for later requests."""
    path = tiny_model_dir("llama")
    prompt = make_prompts(512, [30], seed=3)[0]
    llm = LLM(
        path,
        dtype="float32",
        block_size=4,
        prefix_cache=prefix_cache,
        num_gpu_blocks_override=128,
        check_kv_integrity=True,
    )
    generate(llm, [prompt], greedy())  # warms the cache
    (out,) = generate(llm, [prompt], greedy(prompt_logprobs=4))
    assert out.num_cached_tokens == 0
    assert_matches(out.prompt_logprobs, prompt, reference("llama", prompt), 4)
    # A request wanting them fills the cache too: the same prompt after a reset hits.
    assert llm.engine.kv.reset_prefix_cache()
    generate(llm, [prompt], greedy(prompt_logprobs=1))
    (again,) = generate(llm, [prompt], greedy())
    assert again.num_cached_tokens == 28  # every full block but the last token's


def test_n_samples_share_one_prompt(tiny_model_dir, reference):
    """With n = 3 the prompt logprobs are one list for the request; the other samples
    take the prompt's blocks from the prefix cache instead of computing it again."""
    path = tiny_model_dir("llama")
    prompt = make_prompts(512, [21], seed=8)[0]
    llm = LLM(path, dtype="float32", block_size=4, num_gpu_blocks_override=128)
    params = SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=3, prompt_logprobs=2)
    (out,) = generate(llm, [prompt], params)
    assert len(out.outputs) == 3
    assert_matches(out.prompt_logprobs, prompt, reference("llama", prompt), 2)
    assert llm.engine.kv.stats.hit_requests == 2


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_mid_prompt_emits_each_position_once(
    async_scheduling, tiny_model_dir, reference, caplog
):
    """A pool of 14 blocks of 4 tokens cannot hold these requests at once: some are
    preempted, one of them in the middle of its prompt, and recompute everything (in
    chunks of a 7-token budget, so a recomputed chunk straddles the last position emitted
    before). Each still has exactly one entry per prompt token, all equal to
    transformers'."""
    path = tiny_model_dir("llama")
    prompts = make_prompts(512, [30, 26, 22], seed=2)
    llm = LLM(
        path,
        dtype="float32",
        block_size=4,
        num_gpu_blocks_override=14,
        max_num_batched_tokens=7,
        async_scheduling=async_scheduling,
        check_kv_integrity=True,
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=3)
    with caplog.at_level(logging.INFO, logger="cadence.core.scheduler"):
        outs = generate(llm, prompts, params)
    assert llm.engine.scheduler.num_preemptions > 0
    # "preempted <id> (...): <n> tokens will be recomputed": n < the prompt's length means
    # the request was preempted while its prompt was still being prefilled.
    lens = {str(i): len(p) for i, p in enumerate(prompts)}
    mid_prompt = [
        m
        for r in caplog.records
        if (m := re.match(r"preempted (\S+) .*: (\d+) tokens", r.getMessage()))
        and int(m[2]) < lens[m[1]]
    ]
    assert mid_prompt
    for prompt, out in zip(prompts, outs):
        assert_matches(out.prompt_logprobs, prompt, reference("llama", prompt), 3)


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True])
def test_prompt_logprobs_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match="prompt_logprobs must be an integer in"):
        SamplingParams(prompt_logprobs=bad).verify()


def test_the_wire_format_carries_them():
    """RequestUpdate crosses the process boundary with msgspec: None entries survive."""
    up = RequestUpdate("a", [7], new_prompt_logprobs=[None, (-1.5, [(3, -0.5)]), (-2.0, [])])
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(up), type=RequestUpdate)
    assert back == RequestUpdate(
        "a", [7], new_prompt_logprobs=[None, (-1.5, [(3, -0.5)]), (-2.0, [])]
    )
    plain = RequestUpdate("b", [1])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(plain), type=RequestUpdate) == plain
