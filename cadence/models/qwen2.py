"""Qwen2: the Llama decoder with a bias on the q/k/v projections."""

from cadence.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
