"""The real default model, SmolLM2-135M-Instruct (Q4_1 blocks, a Q8_0 vocabulary), served
from its GGUF blocks: the same values as the float path (transformers' dequantized tensors),
a different kernel. In float32 the two agree to rounding; the default (bf16) holds about
100 MB of weights instead of 540 MB."""

from __future__ import annotations

import pytest
import torch

from cadence import LLM, SamplingParams
from cadence.loader.gguf import (
    convert_gguf,
    default_model_path,
    ensure_float_weights,
    transformers_tensors,
)
from cadence.loader.gguf_tensors import iter_gguf
from cadence.loader.loader import iter_safetensors, load_hf_config, weight_bytes
from cadence.quant.gguf import GgufTensor

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Roses are red,"]


def test_gguf_tensors_carry_hf_names_and_row_order():
    """Q/K rows un-permuted exactly as transformers' GGUF reader does it (compared on the
    blocks' values), every other tensor under its HF name and shape; the float path's
    safetensors (this reader, expanded) hold the same values."""
    folder = convert_gguf(default_model_path())
    ensure_float_weights(folder)
    config = load_hf_config(folder)
    ours = dict(iter_gguf(default_model_path(), config))
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(folder)
    transformers_reading = transformers_tensors(default_model_path(), hf_config)
    wanted = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.7.self_attn.v_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
        "model.layers.3.input_layernorm.weight",
        "model.embed_tokens.weight",
    ]
    checked = 0
    for name, source in iter_safetensors(folder):
        if name not in wanted:
            continue
        mine = ours[name]
        if isinstance(mine, GgufTensor):
            mine = mine.codes().dequantize()
        for theirs in (source[:], transformers_reading[name]):
            assert tuple(mine.shape) == tuple(theirs.shape), name
            torch.testing.assert_close(mine.float(), theirs.float(), rtol=0, atol=0, msg=name)
        checked += 1
    assert checked == len(wanted)
    assert len(ours) == sum(1 for _ in iter_safetensors(folder)) == len(transformers_reading)


@pytest.fixture(scope="module")
def float_path():
    return LLM(dtype="float32", quantization="none", kv_cache_memory=64 * 2**20)


def test_native_blocks_agree_with_the_float_path_in_float32(float_path):
    native = LLM(dtype="float32", quantization="gguf", kv_cache_memory=64 * 2**20)
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3)
    want = float_path.generate(PROMPTS, params, use_tqdm=False)
    got = native.generate(PROMPTS, params, use_tqdm=False)
    for a, b in zip(got, want):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            for tok, lp in lb.items():
                assert abs(la[tok] - lp) < 2e-3


def test_bf16_default_keeps_the_blocks_packed(float_path):
    llm = LLM(kv_cache_memory=64 * 2**20)  # auto: bf16 on a CPU, the GGUF blocks
    model = llm.engine.runner.driver.model
    assert model.layers[0].mlp.gate_up_proj.quant_method.name == "gguf"
    packed = weight_bytes(model)
    plain = weight_bytes(float_path.engine.runner.driver.model) / 2  # the same tensors in bf16
    assert packed < 150 * 2**20 < plain
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    assert "Paris" in out[0].outputs[0].text
