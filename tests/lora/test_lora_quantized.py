"""Adapters over quantized bases: the adapter's products in the activations' dtype on top
of whatever the base multiplies with (FP8 weights, the GGUF blocks of the default model),
tracking the same adapter over the plain base."""

from __future__ import annotations

from model_helpers import make_prompts

from cadence import LLM, LoRARequest, SamplingParams
from cadence.loader.gguf import convert_gguf, default_model_path
from cadence.lora.dummy import write_dummy_adapter

PARAMS = SamplingParams(temperature=0, max_tokens=1, logprobs=5)


def top_logprobs(llm: LLM, prompts, lora) -> list[dict[int, float]]:
    outs = llm.generate(prompts, PARAMS, use_tqdm=False, lora_request=lora)
    return [o.outputs[0].logprobs[0] for o in outs]


def assert_tracks(want: list[dict], got: list[dict], tol: float) -> None:
    for w, g in zip(want, got):
        shared = set(w) & set(g)
        assert len(shared) >= 3
        assert all(abs(w[t] - g[t]) < tol for t in shared), (w, g)


def moved(a: list[dict], b: list[dict]) -> bool:
    """Whether an adapter changed the base's logprobs at all."""
    return any(
        x.keys() != y.keys() or any(abs(x[t] - y[t]) > 1e-3 for t in x) for x, y in zip(a, b)
    )


def test_fp8_base(tiny_model_dir, lora_dir):
    path = tiny_model_dir("llama")
    prompts = [{"prompt_token_ids": p} for p in make_prompts(512, [9, 30, 17], seed=5)]
    lora = LoRARequest("all16", 1, lora_dir("llama", "all16"))
    common = dict(dtype="float32", enable_lora=True, num_gpu_blocks_override=64)
    plain = LLM(path, **common)
    fp8 = LLM(path, quantization="fp8", **common)
    assert fp8.engine.runner.driver.model.layers[0].mlp.gate_up_proj.quant_method.name == "fp8"
    with_adapter = top_logprobs(fp8, prompts, lora)
    assert moved(with_adapter, top_logprobs(fp8, prompts, None))
    assert_tracks(top_logprobs(plain, prompts, lora), with_adapter, 0.3)  # FP8 rounding


def test_gguf_default_model(tmp_path):
    """SmolLM2's Q4_1 blocks + a rank-8 adapter on every projection, against the float
    path (the same blocks dequantized) + the same adapter, in float32."""
    folder = convert_gguf(default_model_path())
    adapter = write_dummy_adapter(folder, str(tmp_path / "smol-lora"), rank=8, seed=0, std=0.05)
    lora = LoRARequest("smol", 1, adapter)
    prompts = ["The capital of France is", "def fibonacci(n):", "Roses are red,"]
    common = dict(dtype="float32", enable_lora=True, max_lora_rank=8, kv_cache_memory=64 * 2**20)
    native = LLM(quantization="gguf", **common)
    assert native.engine.runner.driver.model.layers[0].mlp.gate_up_proj.quant_method.name == "gguf"
    with_adapter = top_logprobs(native, prompts, lora)
    assert moved(with_adapter, top_logprobs(native, prompts, None))
    del native
    float_path = LLM(quantization="none", **common)
    assert_tracks(top_logprobs(float_path, prompts, lora), with_adapter, 2e-3)
