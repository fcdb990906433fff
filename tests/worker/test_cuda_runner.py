"""The model runner on a CUDA device: the Triton backend, CUDA graphs of decode steps and
the memory profile. Skipped without CUDA (run them on the GPU machine)."""

from __future__ import annotations

import gc

import pytest
import torch
from model_helpers import ARCHS, WINDOW, hf_greedy, make_prompts

from cadence import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LENGTHS = [3, 9, 17, 31, 40, 5, 64, 23]
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def generate(llm: LLM, prompts) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def float32_graphs_llm(path: str, **kw) -> LLM:
    """A float32 engine on the GPU that replays CUDA graphs of decode and prefill steps,
    with the synchronous loop (async scheduling, the CUDA default, has its own test)."""
    return LLM(
        path,
        device="cuda",
        dtype="float32",
        num_gpu_blocks_override=512,
        async_scheduling=False,
        cuda_graph_prefill=True,
        **kw,
    )


@pytest.mark.parametrize("kind", ARCHS)
def test_float32_greedy_equals_transformers_with_graphs(kind, tiny_model_dir, hf_model):
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, LENGTHS, seed=1)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = float32_graphs_llm(path)
    assert llm.engine.runner.driver.backend.name == "triton"
    assert generate(llm, prompts) == expected
    assert llm.engine.runner.driver.graphs.num_replays > 0  # decode steps replayed graphs
    assert llm.engine.runner.driver.mixed_graphs.num_replays > 0  # and prefill steps theirs


# The families whose attention differs on the Triton path: windows (interleaved or not),
# soft-caps, head dims that are not powers of two, per-layer rotary tables.
ZOO_ON_TRITON = [
    "mistral-window",
    "mistral-window-d24",
    "qwen2-window",
    "gemma2",
    "gemma3",
    "phi3",
    "cohere2",
    "mixtral",  # mixtures of experts: the Triton grouped GEMMs inside the graphs
    "qwen2-moe",
    "qwen3-moe",
    "olmoe",
    "granite-moe-shared",
    "gpt-oss",  # attention sinks (kernel B and the split-KV reduce), biased clamped experts
    "glm4-moe",  # DeepSeek-V3's grouped sigmoid routing (torch ops) inside the graphs
    "deepseek-v2",  # latent attention: triton_mla's kernels (key splits in decode graphs)
    "deepseek-v3",
]


@pytest.mark.parametrize("kind", ZOO_ON_TRITON)
def test_zoo_float32_greedy_equals_transformers_on_triton(kind, tiny_model_dir, hf_model):
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, [3, 2 * WINDOW + 5, 17, 40, WINDOW, 70], seed=11)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    # A 16-token budget chunks the long prompts beside decodes, through graphs and not.
    llm = float32_graphs_llm(path, max_num_batched_tokens=16)
    assert llm.engine.runner.driver.backend.name == "triton"
    assert generate(llm, prompts) == expected
    assert llm.engine.runner.driver.graphs.num_replays > 0


@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe", "gpt-oss"])
def test_moe_pair_gemvs_in_graphs_equal_transformers(kind, tiny_model_dir, hf_model, monkeypatch):
    """Steps of up to 4 tokens through the per-pair GEMVs (cadence/ops/moe_pairs.py, as a
    tile table's "pairs" entry sends them; Mixtral's and Qwen3's routing inside them, GPT-OSS's
    biased experts after it), captured in decode graphs; larger steps through the grouped
    GEMMs: transformers' greedy tokens either way."""
    from cadence.ops import moe_pairs, moe_tiles

    real_config, calls = moe_tiles.config, []

    def with_pairs(device, dtype, shape, tokens, top_k):
        entry = dict(real_config(device, dtype, shape, tokens, top_k))
        if tokens <= 4:
            entry["pairs"] = moe_pairs.DEFAULT_TILES
        return entry

    def counted(real):
        def call(*args, **kwargs):
            calls.append((real.__name__, args[0].shape[0]))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(moe_tiles, "config", with_pairs)
    for name in ("pair_experts", "pair_experts_routed"):
        monkeypatch.setattr(moe_pairs, name, counted(getattr(moe_pairs, name)))
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, [3, 40, 17, 9], seed=13)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = float32_graphs_llm(path, max_num_seqs=4)
    assert generate(llm, prompts) == expected
    assert calls and max(t for _, t in calls) <= 4
    routed = kind != "gpt-oss"  # (GPT-OSS's experts have biases: routed first)
    assert {name for name, _ in calls} == {"pair_experts_routed" if routed else "pair_experts"}
    assert llm.engine.runner.driver.graphs.num_replays > 0


def test_served_defaults_bounded_prefill_in_graphs_equal_transformers(tiny_model_dir, hf_model):
    """`cadence serve`'s GPU defaults in small: prompt tokens beside decodes bounded (24),
    mixed steps up to the bound plus a token a decode (24 + 8) replayed in graphs, larger
    steps (nobody decoding) eager, async scheduling, the step pacer timing the steps: still
    transformers' greedy tokens."""
    path = tiny_model_dir("llama")
    prompts = make_prompts(512, [3, 90, 17, 40, 5, 130, 23, 64, 9, 31], seed=5)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = LLM(
        path, device="cuda", dtype="float32", num_gpu_blocks_override=512,
        max_num_seqs=8, max_num_batched_tokens=128, max_prefill_tokens_while_decoding=24,
        cuda_graph_prefill=True, async_scheduling=True, mixed_step_factor=2.5,
    )  # fmt: skip
    runner = llm.engine.runner.driver
    assert runner.mixed_graphs.sizes[-1] == 24 + 8
    assert generate(llm, prompts) == expected
    assert runner.mixed_graphs.num_replays > 0 and runner.graphs.num_replays > 0
    assert llm.engine.scheduler.pacer.decode_s > 0  # (the pacer timed the async steps)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_graph_replay_gives_the_same_tokens_as_eager(kind, tiny_model_dir):
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, [5, 50, 7, 120, 33, 2, 90, 17, 64, 3], seed=3)
    kw = dict(device="cuda", dtype="bfloat16", num_gpu_blocks_override=512)
    graphs = LLM(path, cuda_graph_prefill=True, **kw)
    eager = LLM(path, enforce_eager=True, cuda_graph_prefill=True, **kw)
    assert (
        eager.engine.runner.driver.graphs is None
        and eager.engine.runner.driver.mixed_graphs is None
    )
    assert generate(graphs, prompts) == generate(eager, prompts)
    assert graphs.engine.runner.driver.mixed_graphs.num_replays > 0


@pytest.mark.parametrize("kind", ARCHS)
def test_bfloat16_logprobs_close_to_transformers(kind, tiny_model_dir, hf_model):
    path = tiny_model_dir(kind)
    prompt = make_prompts(512, [27], seed=7)[0]
    llm = LLM(path, device="cuda", dtype="bfloat16", num_gpu_blocks_override=64)
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=5),
        use_tqdm=False,
    )[0].outputs[0]
    model = hf_model(path)
    ids = prompt + out.token_ids[:-1]
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    for step, lps in enumerate(out.logprobs):
        row = ref[len(prompt) - 1 + step]
        for tid, lp in lps.items():
            assert abs(lp - float(row[tid])) < 0.1, (step, tid)


def test_memory_profile_sizes_the_pool_from_the_utilization(tiny_model_dir):
    path = tiny_model_dir("llama")
    blocks = {}
    for util in (0.05, 0.10):
        llm = LLM(path, device="cuda", dtype="bfloat16", gpu_memory_utilization=util)
        blocks[util] = llm.engine.runner.num_blocks
        per_block = llm.engine.runner.driver._kv_bytes_per_block()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info()[1]
    grown = (blocks[0.10] - blocks[0.05]) * per_block
    assert abs(grown - 0.05 * total) < 0.01 * total


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_async_scheduling_by_default_with_graphs_equals_transformers(
    kind, tiny_model_dir, hf_model
):
    path = tiny_model_dir(kind)
    prompts = make_prompts(512, LENGTHS, seed=1)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = LLM(
        path,
        device="cuda",
        dtype="float32",
        num_gpu_blocks_override=512,
        check_kv_integrity=True,
    )
    assert llm.config.scheduler.async_scheduling  # the default on CUDA
    assert generate(llm, prompts) == expected
    assert llm.engine.runner.driver.graphs.num_replays > 0
    assert llm.engine.runner.driver.mixed_graphs is None  # off by default


# A model with 4096 positions: contexts past split_min_context (1024) replay the split-KV
# decode graphs, alone (batch 1) and padded (3 decodes in the graph of 4).
LONG_LENGTHS = [3000, 1500, 1100]


def test_long_prompts_with_split_kv_graphs_equal_transformers(tiny_model_dir, hf_model):
    path = tiny_model_dir("llama-long")
    prompts = make_prompts(512, LONG_LENGTHS, seed=4)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = LLM(path, device="cuda", dtype="float32", num_gpu_blocks_override=1024)
    assert generate(llm, prompts[:1]) == expected[:1]
    assert generate(llm, prompts) == expected
    assert llm.engine.runner.driver.graphs.num_split_replays > 0


def test_long_prompts_split_kv_graphs_equal_eager(tiny_model_dir):
    path = tiny_model_dir("llama-long")
    prompts = make_prompts(512, LONG_LENGTHS + [30], seed=5)
    kw = dict(device="cuda", dtype="bfloat16", num_gpu_blocks_override=1024)
    graphs = LLM(path, **kw)
    eager = LLM(path, enforce_eager=True, **kw)
    assert generate(graphs, prompts) == generate(eager, prompts)
    assert graphs.engine.runner.driver.graphs.num_split_replays > 0


def test_mixed_step_graphs_with_a_small_token_budget_equal_transformers(tiny_model_dir, hf_model):
    """A budget of 24 tokens: every prefill is chunked, and chunks share steps with decodes,
    so nearly every step replays a mixed-step graph (buckets 16 and 24, the budget)."""
    path = tiny_model_dir("llama")
    prompts = make_prompts(512, LENGTHS, seed=2)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = LLM(
        path,
        device="cuda",
        dtype="float32",
        num_gpu_blocks_override=512,
        max_num_batched_tokens=24,
        cuda_graph_prefill=True,
    )
    assert llm.engine.runner.driver.mixed_graphs.sizes == [16, 24]
    assert generate(llm, prompts) == expected
    assert llm.engine.runner.driver.mixed_graphs.num_replays > 0


def test_mixed_step_graphs_past_512_tokens_equal_transformers(tiny_model_dir, hf_model):
    """Prompts of 600-1,500 tokens under a 2,048-token budget: steps of 513-2,048 tokens
    (prompt chunks beside decodes) replay the wide buckets, and the tokens stay HF's."""
    path = tiny_model_dir("llama-long")
    prompts = make_prompts(512, [700, 1500, 30, 900, 610], seed=4)
    expected = [hf_greedy(hf_model(path), p, NEW_TOKENS) for p in prompts]
    llm = float32_graphs_llm(path, max_num_batched_tokens=2048)
    mixed = llm.engine.runner.driver.mixed_graphs
    assert mixed.sizes[-1] == 2048
    replayed: list[int] = []  # the bucket of every replay
    run = mixed.run

    def recording_run(size, *args, **kwargs):
        replayed.append(size)
        return run(size, *args, **kwargs)

    mixed.run = recording_run
    assert generate(llm, prompts) == expected
    assert any(size > 512 for size in replayed), replayed
