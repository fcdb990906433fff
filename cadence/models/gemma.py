"""The Gemma family. Gemma: Llama's layout with Gemma's RMSNorm (1 + w, in float32), a
GeGLU MLP, embeddings scaled by sqrt(hidden) and tied logits. Gemma 2 adds norms after
attention and the MLP (sandwich layers), alternating sliding-window and global layers,
soft-capped attention scores and logits, and a query scale of query_pre_attn_scalar.
Gemma 3 (text) drops the soft-caps, adds a norm over each head of q and k, and gives its
sliding layers a rotary table of their own (a lower base)."""

from __future__ import annotations

from dataclasses import replace

import torch

from cadence.layers.norm import GemmaRMSNorm
from cadence.layers.rotary import RotaryEmbedding
from cadence.models.attention import AttentionOptions, head_dim_of
from cadence.models.decoder import DecoderForCausalLM, SandwichLayer
from cadence.models.mlp import GatedMLP


def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if not cap else torch.tanh(logits / cap) * cap


class GemmaForCausalLM(DecoderForCausalLM):
    def make_norm(self, config, size: int):
        return GemmaRMSNorm(size, config.rms_norm_eps)

    def make_mlp(self, config, layer: int):
        return GatedMLP(config, act=getattr(config, "hidden_activation", None) or config.hidden_act)

    def embedding_scale(self, config) -> float:
        return config.hidden_size**0.5


class Gemma2ForCausalLM(GemmaForCausalLM):
    layer_kind = SandwichLayer

    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(
            super().attention_options(config, layer),
            scale=config.query_pre_attn_scalar**-0.5,
            softcap=getattr(config, "attn_logit_softcapping", None) or None,  # 0: no cap
        )

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return _softcap(logits, getattr(self.config, "final_logit_softcapping", None))


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = replace(super().attention_options(config, layer), qk_norm="head")
        options = replace(options, norm=GemmaRMSNorm)
        if config.layer_types[layer] == "sliding_attention":
            options = replace(options, rotary_kind="local")
        return options

    def rotary_tables(self, config, max_position: int) -> dict[str, RotaryEmbedding]:
        dim = head_dim_of(config)
        return {
            "global": RotaryEmbedding(config, dim, max_position, "full_attention"),
            "local": RotaryEmbedding(config, dim, max_position, "sliding_attention"),
        }
