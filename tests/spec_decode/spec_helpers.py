"""Checkpoints the speculative-decoding tests draft with: a noisy copy of a tiny target
(a draft model that agrees with it often, not always), and a random EAGLE-3 head saved in
the public checkpoint format."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from model_helpers import TINY
from safetensors.torch import save_file


def noisy_copy(target_dir: str, out_dir: Path, noise: float, seed: int = 0) -> str:
    """The target's weights plus Gaussian noise (relative to each tensor's scale)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std())
    model.save_pretrained(out_dir)
    return str(out_dir)


def eagle3_head(out_dir: Path, draft_vocab: int = 256, seed: int = 0) -> str:
    """A random EAGLE-3 head for a TINY target (hidden 64, vocab 512), in the layout of the
    public checkpoints: `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t` / `t2d`, config.json
    with draft_vocab_size and eagle_config. Draft id i means target id 2 i."""
    g = torch.Generator().manual_seed(seed)
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    heads, kv_heads = TINY["num_attention_heads"], TINY["num_key_value_heads"]
    d = h // heads

    def w(*shape):
        return torch.randn(shape, generator=g) * 0.1

    tensors = {
        "fc.weight": w(h, 3 * h),
        "midlayer.input_layernorm.weight": 1 + w(h),
        "midlayer.hidden_norm.weight": 1 + w(h),
        "midlayer.self_attn.q_proj.weight": w(heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": w(kv_heads * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(kv_heads * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": w(h, heads * d),
        "midlayer.post_attention_layernorm.weight": 1 + w(h),
        "midlayer.mlp.gate_proj.weight": w(inter, h),
        "midlayer.mlp.up_proj.weight": w(inter, h),
        "midlayer.mlp.down_proj.weight": w(h, inter),
        "norm.weight": 1 + w(h),
        "lm_head.weight": w(draft_vocab, h),
        "d2t": torch.arange(draft_vocab, dtype=torch.int64),  # i -> i + i
        "t2d": torch.arange(TINY["vocab_size"]) % 2 == 0,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": TINY["rms_norm_eps"],
        "vocab_size": TINY["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "max_position_embeddings": TINY["max_position_embeddings"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 1]},
    }
    (out_dir / "config.json").write_text(json.dumps(config))
    return str(out_dir)
