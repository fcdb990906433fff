"""SmolLM3: Llama's layout where some layers take no rotary at all (`no_rope_layers`: 1 for
a layer that rotates, 0 for one that does not)."""

from __future__ import annotations

from dataclasses import replace

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM


class SmolLM3ForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        return options if config.no_rope_layers[layer] else replace(options, rotary_dim=0)
