"""Qwen3: Llama's blocks with an RMSNorm over each head of q and k, before rotary."""

from __future__ import annotations

from dataclasses import replace

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), qk_norm="head")
