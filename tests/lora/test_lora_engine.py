"""Multi-LoRA in the engine: greedy float32 output equals transformers + peft for every
adapter and for the base model, all in one batch, whatever the slots, the CPU copies, the
token budget, the prefix cache or preemption; adapters never share K/V; the engine
refuses, naming why, what it cannot run."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from lora_helpers import ADAPTERS
from model_helpers import make_prompts

from cadence import LLM, LoRARequest, SamplingParams

NEW_TOKENS = 12
LENGTHS = [5, 17, 9, 30]
CPU = dict(dtype="float32", device="cpu", enable_lora=True, max_lora_rank=16)


def greedy(llm: LLM, prompts, loras) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def mixed_batch(kind, lora_dir, peft_greedy, prompts, names=tuple(ADAPTERS)):
    """Every prompt under the base model and under each adapter, interleaved: the batch,
    its LoRARequests, and the oracle's tokens."""
    loras = {name: LoRARequest(name, i + 1, lora_dir(kind, name)) for i, name in enumerate(names)}
    batch, which, expected = [], [], []
    refs = {n: peft_greedy(kind, n, prompts, NEW_TOKENS) for n in (None, *names)}
    for i, p in enumerate(prompts):
        for name in (None, *names):
            batch.append(p)
            which.append(loras.get(name))
            expected.append(refs[name][i])
    return batch, which, expected


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_adapters_and_base_in_one_batch_equal_peft(kind, tiny_model_dir, lora_dir, peft_greedy):
    """Three adapters (ranks 4, 8, 16; attention only, everything, some of each block;
    alpha / r and rsLoRA) and the base model, mixed in every step; two slots and two CPU
    copies for three adapters, four sequences at a time: requests wait for a slot, and
    adapters come back into slots (and from their folders) again."""
    prompts = make_prompts(512, LENGTHS, seed=3)
    batch, loras, expected = mixed_batch(kind, lora_dir, peft_greedy, prompts)
    assert len({tuple(e) for e in expected}) > len(prompts)  # the adapters change outputs
    llm = LLM(tiny_model_dir(kind), max_loras=2, max_cpu_loras=2, max_num_seqs=4, **CPU)
    assert greedy(llm, batch, loras) == expected
    manager = llm.engine.runner.driver.lora
    assert manager.slot_loads > 3  # three adapters through two slots, more than once


@pytest.mark.parametrize(
    ("kind", "names"),
    [("phi3", ("fused8",)), ("qwen3-moe", ("qv8",)), ("gemma2", ("all16", "mlp4"))],
)
def test_other_families(kind, names, tiny_model_dir, lora_dir, peft_greedy):
    """Phi-3's fused qkv_proj / gate_up_proj adapted as PEFT adapts them (B's rows split
    among the parts); a mixture's attention (its experts have no adapter); Gemma 2's
    sandwich layers."""
    prompts = make_prompts(512, [5, 17], seed=3)
    batch, loras, expected = mixed_batch(kind, lora_dir, peft_greedy, prompts, names)
    assert len({tuple(e) for e in expected}) > len(prompts)
    llm = LLM(tiny_model_dir(kind), **CPU)
    assert greedy(llm, batch, loras) == expected


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        pytest.param({"max_num_batched_tokens": 16}, id="chunked-prefill"),
        pytest.param(
            {"num_gpu_blocks_override": 24, "block_size": 4, "max_num_seqs": 8}, id="preemption"
        ),
        pytest.param({"max_loras": 1, "max_num_seqs": 3}, id="one-slot"),
    ],
)
def test_adapters_through_the_engine_paths(engine_kwargs, tiny_model_dir, lora_dir, peft_greedy):
    prompts = make_prompts(512, LENGTHS, seed=3)
    batch, loras, expected = mixed_batch("llama", lora_dir, peft_greedy, prompts)
    llm = LLM(tiny_model_dir("llama"), check_kv_integrity=True, **{**CPU, **engine_kwargs})
    assert greedy(llm, batch, loras) == expected
    if "num_gpu_blocks_override" in engine_kwargs:
        assert llm.engine.scheduler.num_preemptions > 0


def test_prefix_cache_is_per_adapter(tiny_model_dir, lora_dir, peft_greedy):
    """The same prompt under another adapter (or the base) hits nothing; under the same
    adapter it hits, and the tokens stay the oracle's."""
    prompt = make_prompts(512, [40], seed=5)[0]
    a = LoRARequest("qv8", 1, lora_dir("llama", "qv8"))
    b = LoRARequest("all16", 2, lora_dir("llama", "all16"))
    llm = LLM(tiny_model_dir("llama"), block_size=8, **CPU)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

    def run(lora):
        out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False, lora_request=lora)
        return out[0].num_cached_tokens, list(out[0].outputs[0].token_ids)

    assert run(a) == (0, peft_greedy("llama", "qv8", [prompt], NEW_TOKENS)[0])
    assert run(None) == (0, peft_greedy("llama", None, [prompt], NEW_TOKENS)[0])
    assert run(b) == (0, peft_greedy("llama", "all16", [prompt], NEW_TOKENS)[0])
    cached, tokens = run(a)
    assert (
        cached == (40 - 1) // 8 * 8
        and tokens == peft_greedy("llama", "qv8", [prompt], NEW_TOKENS)[0]
    )


def test_two_ranks_equal_peft(tiny_model_dir, lora_dir, peft_greedy):
    """Tensor parallel: A and B sharded like their layers (a column-parallel projection's
    B by rows, a row-parallel one's A by columns, its partial sums in the all-reduce)."""
    prompts = make_prompts(512, [5, 17], seed=3)
    batch, loras, expected = mixed_batch("llama", lora_dir, peft_greedy, prompts)
    with LLM(tiny_model_dir("llama"), tensor_parallel_size=2, max_loras=3, **CPU) as llm:
        assert greedy(llm, batch, loras) == expected


def _copy_adapter(src: str, dst, edit=None, weights: str | None = None) -> str:
    shutil.copytree(src, dst)
    if edit is not None:
        path = os.path.join(dst, "adapter_config.json")
        with open(path) as f:
            config = json.load(f)
        edit(config)
        with open(path, "w") as f:
            json.dump(config, f)
    if weights is not None:
        os.replace(os.path.join(dst, "adapter_model.safetensors"), os.path.join(dst, weights))
    return str(dst)


def test_bad_adapters_are_refused_naming_why(tiny_model_dir, lora_dir, tmp_path):
    src = lora_dir("llama", "all16")
    llm = LLM(tiny_model_dir("llama"), **{**CPU, "max_lora_rank": 8})
    prompt = {"prompt_token_ids": [1, 2, 3]}

    def refused(path: str, lora_id: int = 1) -> str:
        with pytest.raises(ValueError) as e:
            llm.generate(prompt, use_tqdm=False, lora_request=LoRARequest("x", lora_id, path))
        return str(e.value)

    assert "rank 16 is above this server's --max-lora-rank 8" in refused(src)
    assert "not a folder" in refused(str(tmp_path / "missing"))
    dora = _copy_adapter(
        lora_dir("llama", "qv8"), tmp_path / "dora", lambda c: c.update(use_dora=True)
    )
    assert "DoRA" in refused(dora)
    pickled = _copy_adapter(lora_dir("llama", "qv8"), tmp_path / "bin", weights="adapter_model.bin")
    assert "pickle" in refused(pickled)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (tmp_path / "junk" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    assert "not a readable safetensors file" in refused(str(tmp_path / "junk"))
    assert "lora_int_id must be >= 1" in refused(lora_dir("llama", "qv8"), 0)
    assert llm.engine.scheduler.requests == {}  # nothing was queued
    base = LLM(tiny_model_dir("llama"), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="--enable-lora"):
        base.generate(
            prompt, use_tqdm=False, lora_request=LoRARequest("x", 1, lora_dir("llama", "qv8"))
        )


def test_an_adapter_for_another_model_is_refused(tiny_model_dir, lora_dir):
    """Three layers in the adapter, two in the model: named, not a crash mid-step."""
    from safetensors.torch import load_file

    src = lora_dir("llama", "qv8")
    tensors = load_file(os.path.join(src, "adapter_model.safetensors"))
    assert any(".layers.1." in k for k in tensors)
    llm = LLM(tiny_model_dir("llama"), **CPU)
    from cadence.lora.manager import LoRAManager

    manager: LoRAManager = llm.engine.runner.driver.lora
    # as if the model had one layer: layer 1 fits nothing
    manager.layers = {k: v for k, v in manager.layers.items() if k[0] == 0}
    with pytest.raises(ValueError, match="layer 1 self_attn.q_proj is not a projection"):
        llm.generate(
            {"prompt_token_ids": [1, 2]}, use_tqdm=False, lora_request=LoRARequest("x", 1, src)
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"cuda_graph_prefill": True}, {"enforce_eager": True}],
    ids=["decode-graphs", "mixed-graphs", "eager"],
)
def test_on_cuda_equals_peft(engine_kwargs, tiny_model_dir, lora_dir, peft_greedy):
    """The Triton products in the engine, inside CUDA graphs (decode steps; with
    cuda_graph_prefill also prefill and mixed steps) and eagerly, float32."""
    prompts = make_prompts(512, LENGTHS, seed=3)
    batch, loras, expected = mixed_batch("llama", lora_dir, peft_greedy, prompts)
    llm = LLM(
        tiny_model_dir("llama"),
        **{**CPU, "device": "cuda", "max_loras": 2, "max_num_seqs": 8, **engine_kwargs},
    )
    assert greedy(llm, batch, loras) == expected


def test_an_adapter_that_vanishes_fails_its_step_and_the_engine_recovers(
    tiny_model_dir, lora_dir, peft_greedy, tmp_path
):
    """A folder deleted after its adapter was checked (and dropped from the CPU copies):
    the step that loads it fails and ends its requests (as a server reports them), the
    slots are forgotten, and the next requests run right."""
    vanishing = shutil.copytree(lora_dir("llama", "qv8"), tmp_path / "qv8")
    gone = LoRARequest("gone", 1, str(vanishing))
    other = LoRARequest("all16", 2, lora_dir("llama", "all16"))
    llm = LLM(tiny_model_dir("llama"), max_loras=1, max_cpu_loras=1, **CPU)
    prompt = make_prompts(512, [9], seed=4)
    greedy(llm, prompt, [gone])
    greedy(llm, prompt, [other])  # evicts "gone" from its slot and from CPU memory
    shutil.rmtree(vanishing)
    core = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    core.add_request("doomed", prompt[0], params, lora=gone)
    with pytest.raises(ValueError, match="not a folder"):
        core.step()
    assert core.fail_step() == ["doomed"]
    assert greedy(llm, prompt, [other]) == peft_greedy("llama", "all16", prompt, NEW_TOKENS)
    assert greedy(llm, prompt, [None]) == peft_greedy("llama", None, prompt, NEW_TOKENS)
