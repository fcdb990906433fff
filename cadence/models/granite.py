"""Granite 3: Llama's layout with four scalars: embeddings times embedding_multiplier,
each block's output times residual_multiplier, attention scores times
attention_multiplier (not 1/sqrt(head_dim)), logits divided by logits_scaling."""

from __future__ import annotations

from dataclasses import replace

import torch

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM


class GraniteForCausalLM(DecoderForCausalLM):
    def __init__(self, config, backend, max_position: int) -> None:
        super().__init__(config, backend, max_position)
        for layer in self.layers:
            layer.residual_scale = config.residual_multiplier

    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), scale=config.attention_multiplier)

    def embedding_scale(self, config) -> float:
        return config.embedding_multiplier

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.config.logits_scaling
