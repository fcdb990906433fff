"""DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM) and DeepSeek-V3 / R1 (DeepseekV3ForCausalLM):
multi-head latent attention (models/mla.py; the KV pool stores each token's latent) and,
after the first `first_k_dense_replace` dense layers, a mixture of routed experts beside
ungated shared experts.

Routing (what transformers does; other settings are refused, not served differently):
    V2  softmax over the experts in float32; "greedy": the top k; "group_limited_greedy":
        only the topk_group groups whose best expert scores highest are eligible; the
        weights scaled by routed_scaling_factor, never renormalised (transformers ignores
        V2's norm_topk_prob; every released V2 sets it false)
    V3  "noaux_tc": sigmoid scores with a correction bias, groups ranked by their two
        best, the chosen weights renormalised (norm_topk_prob) and scaled
        (moe.route_grouped, as GLM-4.5)
Every layer from first_k_dense_replace on is a mixture (moe_layer_freq 1, as released).

The rope dims rotate in interleaved pairs (DeepSeek's layout; V3's `rope_interleave`
False: the two halves, as Llama). The checkpoints' multi-token-prediction layers (past
num_hidden_layers) are not loaded.
"""

from __future__ import annotations

from torch import nn

from cadence.attention.base import AttentionBackend
from cadence.layers.rotary import RotaryEmbedding
from cadence.models.decoder import DecoderForCausalLM
from cadence.models.mla import LatentAttention
from cadence.models.moe import MoEOptions, SparseMoE


class DeepseekV2ForCausalLM(DecoderForCausalLM):
    fused_names = {
        "q_proj": ("qkv_proj", 0),  # (no q_lora_rank: V2-Lite)
        "q_a_proj": ("qkv_proj", 0),
        "kv_a_proj_with_mqa": ("qkv_proj", 1),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def rope_interleaved(self, config) -> bool:
        return True

    def make_attention(self, config, backend: AttentionBackend, layer: int) -> nn.Module:
        return LatentAttention(config, backend, self.rope_interleaved(config))

    def rotary_tables(self, config, max_position: int) -> dict[str, RotaryEmbedding]:
        return {"global": RotaryEmbedding(config, config.qk_rope_head_dim, max_position)}

    scoring_func = "softmax"
    topk_methods: tuple[str, ...] = ("greedy", "group_limited_greedy")

    def check_routing(self, config) -> None:
        """Refuse what this family would route differently from its checkpoints."""
        method = getattr(config, "topk_method", None) or self.topk_methods[0]
        scoring = getattr(config, "scoring_func", None) or self.scoring_func
        freq = getattr(config, "moe_layer_freq", None) or 1
        for what, value, allowed in (
            ("topk_method", method, self.topk_methods),
            ("scoring_func", scoring, (self.scoring_func,)),
            ("moe_layer_freq", freq, (1,)),
        ):
            if value not in allowed:
                raise ValueError(
                    f"{type(self).__name__} with {what}={value!r} is not supported "
                    f"(supported: {', '.join(map(repr, allowed))})"
                )

    def moe_options(self, config) -> MoEOptions:
        grouped = getattr(config, "topk_method", None) == "group_limited_greedy"
        return MoEOptions(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=False,
            float32_weights=True,
            float32_router=True,
            shared_intermediate_size=config.moe_intermediate_size * (config.n_shared_experts or 0),
            shared_gate=False,
            num_groups=config.n_group if grouped else 1,
            topk_groups=config.topk_group if grouped else 1,
            routed_scale=config.routed_scaling_factor,
        )

    def make_mlp(self, config, layer: int) -> nn.Module:
        if layer < (config.first_k_dense_replace or 0):
            return super().make_mlp(config, layer)
        self.check_routing(config)
        return SparseMoE(config, self.moe_options(config))

    def checkpoint_name(self, name: str) -> str | None:
        parts = name.split(".")
        if parts[0] == "layers" and int(parts[1]) >= self.config.num_hidden_layers:
            return None  # a multi-token-prediction layer
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    scoring_func = "sigmoid"
    topk_methods = ("noaux_tc",)

    def rope_interleaved(self, config) -> bool:
        return bool(getattr(config, "rope_interleave", True))

    def moe_options(self, config) -> MoEOptions:
        return MoEOptions(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=bool(config.norm_topk_prob),
            float32_weights=True,
            shared_intermediate_size=config.moe_intermediate_size * (config.n_shared_experts or 0),
            shared_gate=False,
            scoring="sigmoid",
            num_groups=config.n_group or 1,
            topk_groups=config.topk_group or 1,
            routed_scale=config.routed_scaling_factor,
        )
