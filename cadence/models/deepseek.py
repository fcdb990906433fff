"""DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM) and DeepSeek-V3 / R1 (DeepseekV3ForCausalLM):
multi-head latent attention (models/mla.py; the KV pool stores each token's latent) and,
after the first `first_k_dense_replace` dense layers, a mixture of routed experts beside
ungated shared experts.

Routing:
    V2  softmax over the experts in float32; "greedy": the top k; "group_limited_greedy":
        only the topk_group groups whose best expert scores highest are eligible; the
        weights scaled by routed_scaling_factor (renormalised first where norm_topk_prob)
    V3  sigmoid scores with a correction bias, groups ranked by their two best, the chosen
        weights renormalised and scaled (moe.route_grouped, as GLM-4.5)

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

    def moe_options(self, config) -> MoEOptions:
        method = getattr(config, "topk_method", None) or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"DeepSeek-V2 routing {method!r} is not supported")
        grouped = method == "group_limited_greedy"
        return MoEOptions(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            renormalize=bool(getattr(config, "norm_topk_prob", False)),
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
        return SparseMoE(config, self.moe_options(config))

    def checkpoint_name(self, name: str) -> str | None:
        parts = name.split(".")
        if parts[0] == "layers" and int(parts[1]) >= self.config.num_hidden_layers:
            return None  # a multi-token-prediction layer
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
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
