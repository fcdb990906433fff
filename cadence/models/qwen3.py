"""Qwen3: the Llama decoder with an RMSNorm over each head of q and k, before rotary."""

from cadence.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
