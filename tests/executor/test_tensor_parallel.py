"""Tensor parallelism on the CPU: two ranks over gloo (the `mp` executor: rank 0 in this
process, rank 1 a child process) give transformers' greedy tokens in float32, and the
same tokens as one rank, for every architecture, with KV heads split and replicated, and
with what the engine does around the model (chunked prefill, preemption, the prefix cache,
async scheduling, structured outputs)."""

from __future__ import annotations

import re

import pytest
from tp_helpers import (
    CPU,
    NEW_TOKENS,
    greedy,
    hf_reference,
    prompts_for,
    save_tiny_with_tokenizer,
)

from cadence import LLM, SamplingParams


@pytest.mark.parametrize(
    "kind",
    [
        "llama",
        "llama-tied",
        "qwen2",
        "qwen3",
        "llama-mqa",
        "gemma2",
        "qwen2-moe",
        "gpt-oss",
        "deepseek-v3",
    ],  # fmt: skip
)
def test_two_ranks_equal_one_rank_and_transformers(kind, tiny_model_dir, hf_model):
    # llama-mqa has one KV head: both ranks hold a replica of it. gemma2's local and global
    # layers keep a block list per KV group: every rank's tables follow the same groups.
    # qwen2-moe: each rank holds half of every expert's columns (and of the shared one's),
    # or with expert parallelism half of the experts (the shared one split by columns).
    # gpt-oss: each rank its heads' sinks and half of every expert's columns, the down
    # bias added by one rank only; with expert parallelism half of the experts, each with
    # its own biases. deepseek-v3: each rank its heads' query and up-projection rows and
    # the whole latent (every head reads it), so each rank caches every token's latent.
    path = tiny_model_dir(kind)
    prompts = prompts_for(path)
    expected = hf_reference(hf_model(path), prompts)
    with LLM(path, **CPU) as one:
        assert greedy(one, prompts) == expected
    with LLM(path, tensor_parallel_size=2, **CPU) as two:
        assert type(two.engine.runner).__name__ == "MultiprocExecutor"
        assert two.engine.runner.driver.model.layers[0].self_attn.num_heads == 2  # 4 heads / 2
        assert greedy(two, prompts) == expected
    if kind in ("qwen2-moe", "gpt-oss"):  # --enable-expert-parallel: 4 whole experts a rank
        with LLM(path, tensor_parallel_size=2, enable_expert_parallel=True, **CPU) as ep:
            experts = ep.engine.runner.driver.model.layers[0].mlp.experts
            assert (experts.num_local, experts.first_expert) == (4, 0)
            width = {"qwen2-moe": 48, "gpt-oss": 128}[kind]
            assert experts.w13_weight.shape[1] == 2 * width  # every column of its experts
            assert greedy(ep, prompts) == expected


def test_engine_features_under_tp(tiny_model_dir, hf_model):
    """One 2-rank engine through chunked prefill, preemption, prefix-cache hits and async
    scheduling (rank 0 resolves a step after launching the next; rank 1 must mirror it)."""
    path = tiny_model_dir("llama")
    prompts = prompts_for(path) + prompts_for(path)[:1]  # the repeat hits the prefix cache
    expected = hf_reference(hf_model(path), prompts, 24)
    with LLM(
        path,
        tensor_parallel_size=2,
        max_num_batched_tokens=16,  # prompts of 17 and 40 tokens prefill in chunks
        num_gpu_blocks_override=8,  # 128 tokens for 4 requests of up to 64: preemptions
        async_scheduling=True,
        **CPU,
    ) as llm:
        assert greedy(llm, prompts, 24) == expected
        stats = llm.engine.stats()
        assert stats.num_preemptions > 0
        assert stats.prefix_hits > 0


def test_structured_outputs_sampling_and_logprobs_under_tp(tmp_path):
    """Rank 0 applies the grammar's mask, samples (seeded) and computes logprobs (prompt
    logprobs need every rank's logits: the ranks compute them together); rank 1 takes its
    tokens. Everything equals one rank's."""
    path = save_tiny_with_tokenizer(str(tmp_path / "tiny-tok"))
    regex = SamplingParams(
        max_tokens=16, temperature=0.0, structured_outputs={"regex": r"[a-z]{3,8} [0-9]{2}"}
    )
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    lps = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, prompt_logprobs=1)
    runs = []
    for tp in (1, 2):
        with LLM(path, tensor_parallel_size=tp, **CPU) as llm:
            outs = llm.generate(
                ["Name a fruit and a number:"] * 3, [regex, seeded, lps], use_tqdm=False
            )
            runs.append(outs)
    one, two = runs
    for a, b in zip(one, two):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    text = two[0].outputs[0].text
    assert re.fullmatch(r"[a-z]{3,8} [0-9]{2}", text), text
    for a, b in zip(one[2].outputs[0].logprobs, two[2].outputs[0].logprobs):
        assert a.keys() == b.keys()
        for tid in a:
            assert abs(a[tid] - b[tid]) < 1e-4
    prompt_one = [p for p in one[2].prompt_logprobs if p]
    prompt_two = [p for p in two[2].prompt_logprobs if p]
    assert len(prompt_one) == len(prompt_two) > 0
    for a, b in zip(prompt_one, prompt_two):
        assert a.keys() == b.keys()
        assert all(abs(a[t] - b[t]) < 1e-4 for t in a)


def test_bad_tensor_parallel_sizes_are_refused(tiny_model_dir):
    path = tiny_model_dir("llama")
    with pytest.raises(ValueError, match="divisible by the tensor-parallel size 3"):
        LLM(path, tensor_parallel_size=3, **CPU)
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        LLM(path, tensor_parallel_size=0, **CPU)
    with pytest.raises(ValueError, match="uniproc executor runs one rank"):
        LLM(path, tensor_parallel_size=2, distributed_executor_backend="uniproc", **CPU)


@pytest.mark.slow
def test_gguf_model_over_three_ranks():
    """The default model (a GGUF file, converted once by rank 0) split over 3 ranks: its 9
    query heads, 3 KV heads and 1,536 MLP columns by 3. Same tokens as one rank."""
    prompts = [[1, 504, 3458, 314, 260], [1, 11658, 28, 638, 429, 346, 47, 2]]
    with LLM(None, **CPU) as one:
        expected = greedy(one, prompts, 8)
    with LLM(None, tensor_parallel_size=3, **CPU) as three:
        assert three.engine.runner.driver.model.layers[0].self_attn.num_kv_heads == 1
        assert greedy(three, prompts, 8) == expected


def test_images_under_tp(tiny_vision_model_dir):
    """A vision-language model on two ranks (Qwen2-VL: M-RoPE positions, a vision tower
    each rank holds whole): the images travel to rank 1 with the step, each rank encodes
    them itself, and the tokens are one rank's, chunked prefill included."""
    from vision_helpers import PLACEHOLDERS, random_image

    path = tiny_vision_model_dir("qwen2_vl")
    image = PLACEHOLDERS["qwen2_vl"]
    requests = [
        {
            "prompt": f"look {image} and {image} now",
            "multi_modal_data": {"image": [random_image(40, 50, 1), random_image(24, 60, 2)]},
        },
        {"prompt": "only words here"},
    ]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)

    def tokens(llm: LLM) -> list[list[int]]:
        return [
            list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)
        ]

    kw = dict(CPU, max_num_batched_tokens=16)
    with LLM(path, **kw) as one:
        expected = tokens(one)
    with LLM(path, tensor_parallel_size=2, **kw) as two:
        assert tokens(two) == expected
