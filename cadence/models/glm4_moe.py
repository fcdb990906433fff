"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (Glm4MoeForCausalLM): grouped-query attention with q/k/v
biases (none on o_proj), partial rotary and optional per-head q/k norms; the first
`first_k_dense_replace` layers keep a dense MLP, the rest a mixture of experts routed as
DeepSeek-V3 routes (sigmoid scores in float32, a correction bias, groups of experts, the
chosen weights renormalised and scaled: moe.route_grouped) beside an ungated shared
expert. The checkpoints' multi-token-prediction layers (past num_hidden_layers) are not
loaded."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM
from cadence.models.moe import MoEOptions, SparseMoE


class Glm4MoeForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        qk_norm = "head" if getattr(config, "use_qk_norm", False) else None
        return replace(options, o_bias=False, qk_norm=qk_norm)

    def make_mlp(self, config, layer: int) -> nn.Module:
        if layer < config.first_k_dense_replace:
            return super().make_mlp(config, layer)
        options = MoEOptions(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
            float32_weights=True,
            shared_intermediate_size=config.moe_intermediate_size * config.n_shared_experts,
            shared_gate=False,
            scoring="sigmoid",
            num_groups=config.n_group,
            topk_groups=config.topk_group,
            routed_scale=config.routed_scaling_factor,
        )
        return SparseMoE(config, options)

    def checkpoint_name(self, name: str) -> str | None:
        parts = name.split(".")
        if parts[0] == "layers" and int(parts[1]) >= self.config.num_hidden_layers:
            return None  # a multi-token-prediction layer
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
