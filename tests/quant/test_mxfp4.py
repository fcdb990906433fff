"""MXFP4 checkpoints (GPT-OSS's release format): the experts' blocks and scales dequantize
to what transformers' own MXFP4 conversion gives, and a tiny GPT-OSS saved with MXFP4
experts serves transformers' greedy tokens on the same dequantized weights, in float32;
under `--quantization fp8` its experts go on to e4m3 and track the dequantized model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_helpers import hf_greedy, make_prompts
from safetensors.torch import load_file, save_file

from cadence import LLM, SamplingParams
from cadence.quant import mxfp4

convert = pytest.importorskip("transformers.integrations.mxfp4").convert_moe_packed_tensors


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., rows, cols] -> (blocks [..., rows, cols / 32, 16], scales [..., rows, cols /
    32]): a power-of-two scale per 32 values, each value rounded to the nearest e2m1."""
    *lead, rows, cols = w.shape
    groups = w.reshape(*lead, rows, cols // 32, 32).float()
    peak = groups.abs().amax(-1).clamp(min=2.0**-100)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    grid = torch.tensor(mxfp4.E2M1[:8])
    index = (scaled.abs()[..., None] - grid).abs().argmin(-1)
    nibbles = (index + 8 * ((scaled < 0) & (index > 0))).to(torch.uint8)
    blocks = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_dequantizing_equals_transformers_conversion():
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(110, 140, (3, 10, 4), dtype=torch.uint8, generator=g)
    ours = mxfp4.dequantize(blocks, scales, torch.float32)
    assert ours.shape == (3, 10, 128)
    theirs = convert(blocks, scales, dtype=torch.float32)  # [E, cols, rows]
    torch.testing.assert_close(ours.transpose(1, 2), theirs)
    # as the loader reads it: one expert at a time, in transformers' layout
    lazy = mxfp4.Dequantized(blocks, scales, torch.float32, torch.device("cpu"))
    assert lazy.shape == theirs.shape
    torch.testing.assert_close(lazy[1], theirs[1])
    torch.testing.assert_close(lazy[2, :, 3:7], theirs[2, :, 3:7])
    torch.testing.assert_close(lazy[0, 5:9], theirs[0, 5:9])
    # and what the test's encoder writes reads back within e2m1's rounding
    w = torch.randn(2, 8, 64, generator=g)
    back = mxfp4.dequantize(*quantize(w), torch.float32)
    assert (back - w).abs().max() <= w.abs().max() / 4


def test_a_broken_pair_is_refused():
    blocks = torch.zeros(2, 4, 2, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        mxfp4.dequantize(blocks, torch.zeros(2, 4, 3, dtype=torch.uint8), torch.float32)
    lone = [("layers.0.mlp.experts.down_proj_blocks", blocks)]
    with pytest.raises(ValueError, match="lack their blocks or scales"):
        list(mxfp4.dequantized(lone, torch.float32, torch.device("cpu")))


def test_an_mxfp4_gpt_oss_serves_transformers_greedy_tokens(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("gpt-oss")
    dst = tmp_path / "gpt-oss-mxfp4"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    dense = {}
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # stored as [E, out, in] rows, the transpose of transformers' dense parameter
            blocks, scales = quantize(tensors.pop(name).transpose(1, 2).contiguous())
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            dense[name] = convert(blocks, scales, dtype=torch.float32)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (dst / "config.json").write_text(json.dumps(config))

    # transformers on the same weights: the dense model with its experts as dequantized
    model = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in dense.items():
            params[name].copy_(value)
    prompts = make_prompts(512, [5, 30], seed=3)
    expected = [hf_greedy(model, p, 8) for p in prompts]

    llm = LLM(str(dst), dtype="float32", num_gpu_blocks_override=64)
    sampling = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    requests = [{"prompt_token_ids": p} for p in prompts]
    got = llm.generate(requests, sampling, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == expected

    # --quantization fp8: MXFP4 -> float -> e4m3 per (expert, row); the biases stay float
    fp8 = LLM(str(dst), dtype="float32", quantization="fp8", num_gpu_blocks_override=64)
    experts = fp8.engine.runner.driver.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == torch.float8_e4m3fn
    assert experts.w2_bias.dtype == torch.float32 and experts.w2_bias.abs().sum() > 0
    # (the tiny model's next-token distribution is nearly flat: its top 5 may reorder, so
    # the float model's top 5 are looked up among the FP8 model's top 20; its gate weights,
    # widened so the SwiGLU clamp bites, widen FP8's rounding too: measured up to 0.33)
    top5 = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    top20 = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    want = [o.outputs[0].logprobs[0] for o in llm.generate(requests, top5, use_tqdm=False)]
    have = [o.outputs[0].logprobs[0] for o in fp8.generate(requests, top20, use_tqdm=False)]
    for w, h in zip(want, have):
        assert all(t in h and abs(w[t] - h[t]) < 0.5 for t in w), (w, h)
