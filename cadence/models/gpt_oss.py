"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): a mixture of experts in every layer, attention with
biases and a learned sink logit per head (AttentionOptions.sinks), sliding-window layers
alternating with full ones (`layer_types`), YaRN rotary. Its experts add biases to the
router and both GEMMs, gate with a clamped SwiGLU, and are stored stacked with gate and up
columns interleaved (moe.py's "gpt_oss" layout); the released checkpoints hold them in
MXFP4, dequantized at load (cadence/quant/mxfp4.py)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM
from cadence.models.moe import MoEOptions, SparseMoE


class GptOssForCausalLM(DecoderForCausalLM):
    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), sinks=True)

    def make_mlp(self, config, layer: int) -> nn.Module:
        options = MoEOptions(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.intermediate_size,
            renormalize=True,  # (a softmax over the top-k logits: the same weights)
            router_bias=True,
            expert_bias=True,
            # (configs from transformers before 5.18 name neither: its code fixed both)
            clamped_swiglu=(
                getattr(config, "swiglu_alpha", 1.702),
                getattr(config, "swiglu_limit", 7.0),
            ),
            stacked_layout="gpt_oss",
        )
        return SparseMoE(config, options)

    def checkpoint_name(self, name: str) -> str | None:
        return name.replace(".mlp.router.", ".mlp.gate.")
