"""Checkpoint folders (sharded or not), dtypes, dummy weights and GGUF conversion."""

from __future__ import annotations

import pytest
import torch
from model_helpers import build_tiny, hf_greedy, make_prompts

from cadence import LLM, SamplingParams
from cadence.loader.loader import resolve_dtype

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_sharded_checkpoint_loads_the_same(tiny_model_dir, tmp_path, hf_model):
    config, cls = build_tiny("qwen2")
    torch.manual_seed(3)
    model = cls(config).eval()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    prompt = make_prompts(512, [11], seed=4)[0]
    llm = LLM(str(tmp_path), dtype="float32", num_gpu_blocks_override=64)
    got = llm.generate({"prompt_token_ids": prompt}, PARAMS)[0].outputs[0].token_ids
    assert got == hf_greedy(model, prompt, 12)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logits_close_to_float32(tiny_model_dir, dtype):
    path = tiny_model_dir("llama")
    prompt = make_prompts(512, [20], seed=5)[0]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    ref = LLM(path, dtype="float32", num_gpu_blocks_override=64).generate(
        {"prompt_token_ids": prompt}, params
    )
    half = LLM(path, dtype=dtype, num_gpu_blocks_override=64)
    assert half.engine.runner.driver.dtype == getattr(torch, dtype)
    out = half.generate({"prompt_token_ids": prompt}, params)
    ref_lps, half_lps = ref[0].outputs[0].logprobs[0], out[0].outputs[0].logprobs[0]
    for tok, lp in ref_lps.items():
        if tok in half_lps:
            assert half_lps[tok] == pytest.approx(lp, abs=0.1)


def test_auto_dtype_follows_the_checkpoint_and_serves_float32_as_bf16(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir("llama"))
    config.dtype = "bfloat16"
    assert resolve_dtype("auto", config, torch.device("cpu")) == torch.bfloat16
    config.dtype = "float32"
    assert resolve_dtype("auto", config, torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("float32", config, torch.device("cpu")) == torch.float32


def test_dummy_weights_have_the_real_shape(tiny_model_dir):
    llm = LLM(
        tiny_model_dir("llama"), load_format="dummy", dtype="float32", num_gpu_blocks_override=64
    )
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, PARAMS)[0].outputs[0]
    assert len(out.token_ids) == 12
    embed = llm.engine.runner.driver.model.embed_tokens.weight
    assert embed.shape == (512, 64) and embed.abs().max() <= 0.02


def test_gguf_conversion_is_cached(tmp_path, monkeypatch):
    """The default GGUF converts once into the cache folder; later loads reuse it."""
    from cadence.loader import gguf

    path = gguf.convert_gguf(gguf.default_model_path())
    again = gguf.convert_gguf(gguf.default_model_path())
    assert path == again
    monkeypatch.setattr(gguf, "load_gguf_checkpoint", None, raising=False)  # would fail if called
    assert gguf.convert_gguf(gguf.default_model_path()) == path


def test_a_cpu_engine_never_imports_triton():
    """Triton's library is ~66 MiB resident once imported, and a CPU engine runs no Triton
    kernel: the default model loads and answers without it (a fresh interpreter, so no
    other test's imports count)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from cadence import LLM, SamplingParams\n"
        "llm = LLM(kv_cache_memory='64MiB')\n"
        "llm.generate(['Hi'], SamplingParams(max_tokens=2), use_tqdm=False)\n"
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
