"""Mixtral: Mistral's attention, and in every layer a mixture of experts in place of the MLP
(`block_sparse_moe` in its checkpoints: a router over 8 experts, top 2, the pair's
softmax weights renormalised and kept in float32)."""

from __future__ import annotations

from torch import nn

from cadence.models.decoder import DecoderForCausalLM
from cadence.models.moe import MoEOptions, SparseMoE


class MixtralForCausalLM(DecoderForCausalLM):
    def make_mlp(self, config, layer: int) -> nn.Module:
        options = MoEOptions(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.intermediate_size,
            renormalize=True,
            float32_weights=True,
        )
        return SparseMoE(config, options)

    def checkpoint_name(self, name: str) -> str | None:
        return name.replace(".block_sparse_moe.", ".mlp.")
