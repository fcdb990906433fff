"""Qwen2 / Qwen2.5: Llama's blocks with biases on q, k and v (not on o); the layers from
`max_window_layers` on slide when `use_sliding_window` is set."""

from __future__ import annotations

from dataclasses import replace

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), qkv_bias=True, o_bias=False)
