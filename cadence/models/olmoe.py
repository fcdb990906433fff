"""OLMoE: pre-norm layers whose attention norms all of q and all of k before the heads
split (as OLMo 2's), and a mixture of experts in every layer (top-k weights not
renormalised by default)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM
from cadence.models.moe import MoEOptions, SparseMoE


class OlmoeForCausalLM(DecoderForCausalLM):
    def __init__(self, config, backend, max_position: int) -> None:
        if getattr(config, "clip_qkv", None) is not None:
            raise ValueError("OLMoE with clip_qkv is not supported yet")
        super().__init__(config, backend, max_position)

    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), qk_norm="full")

    def make_mlp(self, config, layer: int) -> nn.Module:
        options = MoEOptions(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.intermediate_size,
            renormalize=bool(config.norm_topk_prob),
        )
        return SparseMoE(config, options)
