"""Qwen2-MoE and Qwen3-MoE: Qwen2's / Qwen3's attention, and a mixture of experts in the
layers `decoder_sparse_step` picks (every one by default) and `mlp_only_layers` does not;
the others keep a dense MLP. Qwen2-MoE adds a shared expert behind a sigmoid gate."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from cadence.models.attention import AttentionOptions
from cadence.models.moe import MoEOptions, SparseMoE
from cadence.models.qwen2 import Qwen2ForCausalLM
from cadence.models.qwen3 import Qwen3ForCausalLM


def is_sparse(config, layer: int) -> bool:
    """Whether `layer` has a mixture of experts (else a dense MLP), as transformers says."""
    if layer in (getattr(config, "mlp_only_layers", None) or ()):
        return False
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return config.num_experts > 0 and (layer + 1) % step == 0


def moe_options(config, shared: bool) -> MoEOptions:
    """The mixture a Qwen MoE config describes (`shared`: Qwen2-MoE's shared expert)."""
    return MoEOptions(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size,
        renormalize=bool(config.norm_topk_prob),
        shared_intermediate_size=config.shared_expert_intermediate_size if shared else 0,
    )


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        bias = bool(getattr(config, "qkv_bias", True))
        return replace(super().attention_options(config, layer), qkv_bias=bias)

    def make_mlp(self, config, layer: int) -> nn.Module:
        if not is_sparse(config, layer):
            return super().make_mlp(config, layer)
        return SparseMoE(config, moe_options(config, shared=True))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, config, layer: int) -> nn.Module:
        if not is_sparse(config, layer):
            return super().make_mlp(config, layer)
        return SparseMoE(config, moe_options(config, shared=False))
