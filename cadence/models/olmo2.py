"""OLMo 2: norms after attention and after the MLP, none before (post-norm layers), and an
RMSNorm over all of q and all of k before the heads split."""

from __future__ import annotations

from dataclasses import replace

from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM, PostNormLayer


class Olmo2ForCausalLM(DecoderForCausalLM):
    layer_kind = PostNormLayer

    def attention_options(self, config, layer: int) -> AttentionOptions:
        return replace(super().attention_options(config, layer), qk_norm="full")
