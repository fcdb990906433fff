"""GLM-4 (0414): norms before and after attention and the MLP (sandwich layers, under its own
names), half of each head rotated GPT-J style, biases on q/k/v, and gate/up stored fused."""

from __future__ import annotations

from dataclasses import replace

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM, SandwichLayer

# GLM-4's norm names -> ours (its post_attention_layernorm is the one before the MLP)
_NORMS = {
    "post_self_attn_layernorm": "post_attention_layernorm",
    "post_attention_layernorm": "pre_feedforward_layernorm",
    "post_mlp_layernorm": "post_feedforward_layernorm",
}


class Glm4ForCausalLM(DecoderForCausalLM):
    layer_kind = SandwichLayer
    prefused_names = frozenset({"gate_up_proj"})

    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        bias = bool(config.attention_bias)
        return replace(options, qkv_bias=bias, o_bias=False, rotary_interleaved=True)

    def checkpoint_name(self, name: str) -> str:
        parts = name.split(".")
        return ".".join(_NORMS.get(part, part) for part in parts)
