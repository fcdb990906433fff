"""Starcoder2: LayerNorms with biases, a plain (ungated) GELU MLP (`c_fc`, `c_proj`),
biases on every projection where `use_bias`, a sliding window on every layer."""

from __future__ import annotations

from dataclasses import replace

from cadence.layers.norm import LayerNorm
from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM
from cadence.models.mlp import PlainMLP


class Starcoder2ForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        bias = bool(config.use_bias)
        return replace(super().attention_options(config, layer), qkv_bias=bias, o_bias=bias)

    def make_norm(self, config, size: int):
        return LayerNorm(size, config.norm_epsilon)

    def make_mlp(self, config, layer: int):
        return PlainMLP(config, bias=bool(config.use_bias))

    def checkpoint_name(self, name: str) -> str:
        return name.replace(".mlp.c_fc.", ".mlp.gate_up_proj.").replace(
            ".mlp.c_proj.", ".mlp.down_proj."
        )
