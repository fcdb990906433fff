"""StableLM (2): LayerNorms with biases, biases on q/k/v where `use_qkv_bias`, partial rotary
(the first partial_rotary_factor of each head), optionally attention and the MLP side by
side off one norm (`use_parallel_residual`). Per-head q/k LayerNorms are refused."""

from __future__ import annotations

from dataclasses import replace

from cadence.layers.norm import LayerNorm
from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM, ParallelLayer, PreNormLayer


class StableLmForCausalLM(DecoderForCausalLM):
    def __init__(self, config, backend, max_position: int) -> None:
        if getattr(config, "qk_layernorm", False):
            raise ValueError("StableLM with qk_layernorm (per-head LayerNorms) is not supported")
        parallel = getattr(config, "use_parallel_residual", False)
        self.layer_kind = ParallelLayer if parallel else PreNormLayer
        super().__init__(config, backend, max_position)

    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        return replace(options, qkv_bias=bool(config.use_qkv_bias), o_bias=False)

    def make_norm(self, config, size: int):
        return LayerNorm(size, config.layer_norm_eps)
