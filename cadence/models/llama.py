"""Llama (2, 3, 3.1: SmolLM, and Mistral-style configs): the decoder's defaults, pre-norm
layers of grouped-query attention and a SwiGLU MLP.

Under tensor parallelism each rank builds the same model with its share of the heads and
of the MLP's columns (cadence/layers/linear.py says who holds what); the only
communication is inside the parallel layers (o_proj, down_proj, the embedding, logits).
"""

from __future__ import annotations

from cadence.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class MistralForCausalLM(DecoderForCausalLM):
    """Llama's blocks; every layer slides over `sliding_window` keys (Mistral 7B v0.1)."""
