"""Greedy output in float32 equals transformers token for token, whatever the architecture,
token budget, block size, prefix-cache state or number of preemptions."""

from __future__ import annotations

import pytest
import torch
from model_helpers import ARCHS, hf_greedy, make_prompts

from cadence import LLM, SamplingParams

LENGTHS = [3, 9, 17, 31, 40, 5, 64, 23]  # 8 prompts of different lengths
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def references(tiny_model_dir, hf_model):
    """kind -> (prompts, transformers' greedy continuations)."""
    refs = {}

    def get(kind: str):
        if kind not in refs:
            path = tiny_model_dir(kind)
            prompts = make_prompts(512, LENGTHS, seed=1)
            model = hf_model(path)
            refs[kind] = (prompts, [hf_greedy(model, p, NEW_TOKENS) for p in prompts])
        return refs[kind]

    return get


def run(path: str, prompts, **engine_kwargs) -> tuple[LLM, list[list[int]]]:
    engine_kwargs.setdefault("dtype", "float32")
    engine_kwargs.setdefault("check_kv_integrity", True)
    engine_kwargs.setdefault("num_gpu_blocks_override", 512)  # small: the check walks every block
    llm = LLM(path, **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("kind", ARCHS)
def test_greedy_batch_equals_transformers(kind, tiny_model_dir, references):
    prompts, expected = references(kind)
    _, got = run(tiny_model_dir(kind), prompts)
    assert got == expected


@pytest.mark.parametrize("kind", ARCHS)
def test_prefill_and_decode_logprobs_match_transformers(kind, tiny_model_dir, hf_model):
    """The top-20 logprobs of the first (prefill) and later (decode) steps match
    transformers' log-softmax of its logits within float32 tolerance."""
    path = tiny_model_dir(kind)
    prompt = make_prompts(512, [27], seed=7)[0]
    llm = LLM(path, dtype="float32")
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=20),
    )[0].outputs[0]
    model = hf_model(path)
    tokens = prompt + out.token_ids
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    for step, step_lps in enumerate(out.logprobs):
        pos = len(prompt) - 1 + step
        for tok, lp in step_lps.items():
            assert lp == pytest.approx(ref[pos, tok].item(), abs=1e-4), (step, tok)
        top = set(ref[pos].topk(20).indices.tolist())
        assert set(step_lps) - {out.token_ids[step]} <= top


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        pytest.param({"max_num_batched_tokens": 8}, id="budget-8-chunked-mixed"),
        pytest.param(
            {"max_num_batched_tokens": 16, "max_prefill_tokens_while_decoding": 3},
            id="prompt-chunks-of-3-beside-decodes",
        ),
        pytest.param(
            {"max_num_batched_tokens": 16, "mixed_step_factor": 1.5},
            id="steps-timed-into-the-pacer",
        ),
        pytest.param({"block_size": 1}, id="block-size-1"),
        pytest.param({"block_size": 16}, id="block-size-16"),
        pytest.param({"block_size": 7}, id="block-size-7"),
        pytest.param({"max_num_seqs": 3, "max_num_batched_tokens": 20}, id="few-seqs-small-budget"),
        pytest.param({"enable_prefix_caching": False}, id="no-prefix-cache"),
        pytest.param({"prefix_cache": "radix", "block_size": 4}, id="radix"),
        pytest.param(
            {"prefix_cache": "radix", "scheduling_policy": "lpm", "max_num_seqs": 3}, id="radix-lpm"
        ),
        pytest.param(
            {"prefix_cache": "radix", "scheduling_policy": "dfs-weight", "max_num_seqs": 3},
            id="radix-dfs-weight",
        ),
        pytest.param({"scheduling_policy": "priority", "max_num_seqs": 3}, id="priority"),
        pytest.param({"scheduling_policy": "lpm", "max_num_seqs": 3}, id="hash-lpm"),
    ],
)
def test_equality_holds_under_engine_settings(engine_kwargs, tiny_model_dir, references):
    prompts, expected = references("llama")
    _, got = run(tiny_model_dir("llama"), prompts, **engine_kwargs)
    assert got == expected


def test_budget_8_mixes_prefill_chunks_and_decodes(tiny_model_dir):
    """With a budget of 8 tokens, some step runs a prefill chunk beside decoding requests."""
    llm = LLM(tiny_model_dir("llama"), dtype="float32", max_num_batched_tokens=8)
    engine = llm.engine
    prompts = make_prompts(512, [5, 30], seed=3)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    mixed = False
    while engine.has_unfinished_requests():
        sched = engine.scheduler.schedule()
        counts = list(sched.num_scheduled_tokens.values())
        assert sum(counts) <= 8
        mixed |= 1 in counts and any(c > 1 for c in counts)
        engine.scheduler.update(sched, engine.runner.execute(sched))
    assert mixed


def test_the_engine_times_its_steps_into_the_pacer(tiny_model_dir, references):
    """With a mixed-step factor the core hands the scheduler's pacer every step's time, so
    it prices decode steps and prompt tokens (cadence/core/step_pacer.py)."""
    prompts, expected = references("llama")
    kwargs = dict(max_num_batched_tokens=512, mixed_step_factor=2.0, enable_prefix_caching=False)
    llm, got = run(tiny_model_dir("llama"), prompts, **kwargs)
    assert got == expected
    pacer = llm.engine.scheduler.pacer
    assert pacer.decode_s > 0  # (the last requests decode alone)
    # long prompts joining decoding requests, chunks of a few hundred tokens beside them:
    # those steps price a prompt token
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, p in enumerate(make_prompts(512, [40, 300, 380, 260, 420, 330], seed=9)):
        engine.add_request(f"long-{i}", p, params)
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert pacer.per_token_s > 0 and pacer.cap() is not None


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_warm_prefix_cache_gives_hits_and_same_tokens(
    prefix_cache, tiny_model_dir, references, hf_model
):
    prompts, expected = references("llama")
    path = tiny_model_dir("llama")
    llm, first = run(path, prompts, block_size=4, prefix_cache=prefix_cache)
    assert first == expected
    hits_before = llm.engine.kv.stats.hits
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # The same prompts again: every full block but the last token's is a hit.
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == expected
    assert llm.engine.kv.stats.hits > hits_before
    assert all(o.num_cached_tokens == (len(p) - 1) // 4 * 4 for o, p in zip(again, prompts))
    # New prompts sharing those prefixes: hits, and still transformers' tokens.
    extended = [p + [1, 2, 3] for p in prompts]
    outs = llm.generate([{"prompt_token_ids": p} for p in extended], params, use_tqdm=False)
    assert all(o.num_cached_tokens >= len(p) // 4 * 4 for o, p in zip(outs, prompts))
    model = hf_model(path)
    assert [o.outputs[0].token_ids for o in outs] == [
        hf_greedy(model, p, NEW_TOKENS) for p in extended
    ]
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.pool.num_blocks


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_small_kv_pool_preempts_and_stays_exact(prefix_cache, tiny_model_dir, references):
    prompts, expected = references("llama")
    # 40 blocks of 4 tokens: room for ~2 of the 8 requests at full length.
    llm, got = run(
        tiny_model_dir("llama"),
        prompts,
        block_size=4,
        num_gpu_blocks_override=40,
        prefix_cache=prefix_cache,
    )
    assert llm.engine.scheduler.num_preemptions > 0
    assert got == expected
    assert llm.engine.kv.num_free_blocks == 40


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_preemption_and_chunking_on_other_architectures(kind, tiny_model_dir, references):
    prompts, expected = references(kind)
    llm, got = run(
        tiny_model_dir(kind),
        prompts,
        block_size=4,
        num_gpu_blocks_override=40,
        max_num_batched_tokens=16,
    )
    assert llm.engine.scheduler.num_preemptions > 0
    assert got == expected


def test_priority_preemption_keeps_output_exact(tiny_model_dir, references):
    """Two low-priority requests run; an urgent one arrives and preempts the later of them;
    all three still produce transformers' tokens."""
    prompts, expected = references("llama")
    llm = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        num_gpu_blocks_override=512,
        scheduling_policy="priority",
        max_num_seqs=2,
        check_kv_integrity=True,
    )
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    engine.add_request("low-a", prompts[0], params, priority=5)
    engine.add_request("low-b", prompts[1], params, priority=5)
    outputs: dict[str, list[int]] = {"low-a": [], "low-b": [], "urgent": []}
    for _ in range(3):
        for up in engine.step():
            outputs[up.request_id] += up.new_token_ids
    engine.add_request("urgent", prompts[2], params, priority=0)
    while engine.has_unfinished_requests():
        for up in engine.step():
            outputs[up.request_id] += up.new_token_ids
    assert engine.scheduler.num_preemptions >= 1
    assert outputs == {"low-a": expected[0], "low-b": expected[1], "urgent": expected[2]}
