"""GGUF files of the Gemma 1/2/3 and Phi-3 layouts: llama.cpp's names (Gemma's sandwich norms,
Phi-3's fused qkv and gate|up), its stored transforms (Gemma's norms as 1 + w), and the
config fields transformers' GGUF reader leaves out (soft-caps, windows, LongRoPE). (Gemma
1's tensors are read here; its config and tokenizer are not: transformers' GGUF reader has
no "gemma" architecture.)

Each file is written here with gguf-py from a tiny transformers model, in llama.cpp's
layout, and served from a folder that names it (what `convert_gguf` leaves: the config and
the file's path); the tokens must equal the model's own."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from model_helpers import WINDOW, ZOO, hf_greedy, make_prompts

from cadence import LLM, SamplingParams
from cadence.loader.gguf import SOURCE_FILE
from cadence.loader.gguf_arch import fix_config

gguf = pytest.importorskip("gguf")

_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",  # Phi-3: gate and up rows in one tensor
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
_SANDWICH = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_BY_ARCH = {
    "gemma": {"post_attention_layernorm": "ffn_norm"},
    "gemma2": _SANDWICH,
    "gemma3": _SANDWICH,
    "phi3": {"post_attention_layernorm": "ffn_norm"},
}


def gguf_name(hf: str, arch: str) -> str:
    hf = hf.removeprefix("model.")
    top = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    if hf in top or hf == "lm_head.weight":
        return top.get(hf, "output.weight")
    _, layer, rest = hf.split(".", 2)
    owner, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{({**_LAYER, **_BY_ARCH[arch]})[owner]}.{kind}"


def write_gguf(model, arch: str, path, meta: dict, q8_fused: bool = False) -> None:
    """The model's tensors in llama.cpp's layout for `arch`, float32; `q8_fused`: the fused
    projections in Q8_0 blocks instead (the model takes the values they hold)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        writer.add_float32(key, value) if isinstance(value, float) else writer.add_uint32(
            key, value
        )
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        data = tensor.float().numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1  # as llama.cpp's converter stores Gemma's norms
        if q8_fused and ("qkv_proj" in name or "gate_up_proj" in name):
            kind = gguf.GGMLQuantizationType.Q8_0
            blocks = gguf.quants.quantize(data, kind)
            with torch.no_grad():  # the reference computes with what the blocks hold
                tensor.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, kind)))
            writer.add_tensor(gguf_name(name, arch), blocks, raw_dtype=kind)
            continue
        writer.add_tensor(gguf_name(name, arch), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("kind", "q8_fused"),
    [("gemma", False), ("gemma2", False), ("gemma3", False), ("phi3", False), ("phi3", True)],
)
def test_gguf_layouts_serve_the_models_tokens(kind, q8_fused, tmp_path):
    config, cls = ZOO[kind]()
    torch.manual_seed(3)
    model = cls(config).eval()
    with torch.no_grad():  # norms away from their init, so a missed +1 or name shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5) if kind != "phi3" else param.uniform_(0.5, 1.5)
    write_gguf(model, kind, tmp_path / "model.gguf", {}, q8_fused)
    folder = tmp_path / "converted"
    folder.mkdir()
    config.save_pretrained(folder)  # what convert_gguf writes (transformers' reading)
    (folder / SOURCE_FILE).write_text(str(tmp_path / "model.gguf"))
    prompts = make_prompts(512, [3, 2 * WINDOW + 5, 30], seed=2)
    expected = [hf_greedy(model, p, 8) for p in prompts]
    llm = LLM(str(folder), dtype="float32", quantization="gguf", skip_tokenizer_init=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == expected
    if q8_fused:  # the fused rows were split as blocks, not expanded to floats
        qkv = llm.engine.runner.driver.model.layers[0].self_attn.qkv_proj
        assert all(type(k).__name__ != "Dense" for k in qkv.kernels)
        # The file's float vocabulary is made at load, in the model's dtype, not float32.
        bf16 = LLM(str(folder), dtype="bfloat16", quantization="gguf", skip_tokenizer_init=True)
        assert bf16.engine.runner.driver.model.embed_tokens.weight.dtype == torch.bfloat16
        out = bf16.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 8


def test_config_gets_what_transformers_leaves_out(tmp_path):
    gemma = types.SimpleNamespace(num_attention_heads=16, hidden_size=3584, head_dim=256,
                                  num_hidden_layers=42)  # fmt: skip
    meta = {"gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0,
            "gemma2.attention.sliding_window": 4096}  # fmt: skip
    fix_config("gemma2", meta.get, lambda name: None, gemma)
    assert (gemma.attn_logit_softcapping, gemma.final_logit_softcapping) == (50.0, 30.0)
    assert gemma.sliding_window == 4096 and gemma.query_pre_attn_scalar == 256
    big = types.SimpleNamespace(num_attention_heads=32, hidden_size=4608, head_dim=128,
                                num_hidden_layers=46)  # fmt: skip
    fix_config("gemma2", {}.get, lambda name: None, big)
    assert big.query_pre_attn_scalar == 144  # Gemma-2-27B: hidden / heads, as llama.cpp

    factors = {"rope_factors_long.weight": [2.0] * 4, "rope_factors_short.weight": [1.0] * 4}
    phi = types.SimpleNamespace(max_position_embeddings=131072, rope_parameters={"rope_theta": 1e4})
    meta = {
        "phi3.attention.sliding_window": 262144,
        "phi3.rope.scaling.original_context_length": 4096,
    }
    fix_config("phi3", meta.get, factors.get, phi)
    assert phi.sliding_window == 262144
    assert phi.rope_parameters["rope_type"] == "longrope"
    assert phi.rope_parameters["long_factor"] == [2.0] * 4
    assert phi.original_max_position_embeddings == 4096
    assert json.dumps(phi.rope_parameters)  # plain data, as config.json holds it
