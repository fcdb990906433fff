"""Cohere (Command R) and Cohere2 (Command R7B): attention and the MLP side by side off one
bias-free LayerNorm (parallel layers), GPT-J-style (interleaved) rotary, logits times
logit_scale, tied embeddings. Cohere2 slides its windowed layers and gives its global layers
no rotary at all. `use_qk_norm`: a LayerNorm over each head of q and k, a weight per head."""

from __future__ import annotations

from dataclasses import replace

import torch

from cadence.layers.norm import LayerNorm
from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM, ParallelLayer


class CohereForCausalLM(DecoderForCausalLM):
    layer_kind = ParallelLayer

    def attention_options(self, config, layer: int) -> AttentionOptions:
        qk_norm = "per_head" if getattr(config, "use_qk_norm", False) else None
        options = super().attention_options(config, layer)
        return replace(options, rotary_interleaved=True, qk_norm=qk_norm)

    def make_norm(self, config, size: int):
        return LayerNorm(size, config.layer_norm_eps, bias=False)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.logit_scale


class Cohere2ForCausalLM(CohereForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        if config.layer_types[layer] != "sliding_attention":
            options = replace(options, rotary_dim=0)  # global layers: no position signal
        return options
