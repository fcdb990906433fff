"""Tiny random models of each supported architecture, and transformers as the oracle.

Shared by the tests (a module of its own name: several conftest.py files would clash)."""

from __future__ import annotations

import torch

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # A wider init than the default 0.02 keeps logits far enough apart that float32
    # rounding differences cannot flip a greedy choice.
    initializer_range=0.1,
)


def build_tiny(kind: str):
    import transformers as tf

    if kind == "llama":
        return tf.LlamaConfig(**TINY, tie_word_embeddings=False), tf.LlamaForCausalLM
    if kind == "llama-long":  # a few thousand positions: long prompts, split-KV decodes
        return (
            tf.LlamaConfig(**{**TINY, "max_position_embeddings": 4096}, tie_word_embeddings=False),
            tf.LlamaForCausalLM,
        )
    if kind == "llama-tied":  # SmolLM-style: tied embeddings
        return tf.LlamaConfig(**TINY, tie_word_embeddings=True), tf.LlamaForCausalLM
    if kind == "llama-mqa":  # one KV head: fewer KV heads than tensor-parallel ranks
        return (
            tf.LlamaConfig(**{**TINY, "num_key_value_heads": 1}, tie_word_embeddings=False),
            tf.LlamaForCausalLM,
        )
    if kind == "mistral":
        return tf.MistralConfig(**TINY, sliding_window=None, head_dim=16), tf.MistralForCausalLM
    if kind == "qwen2":
        return tf.Qwen2Config(**TINY, tie_word_embeddings=False), tf.Qwen2ForCausalLM
    if kind == "qwen3":
        return tf.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False), tf.Qwen3ForCausalLM
    raise ValueError(kind)


ARCHS = ["llama", "llama-tied", "mistral", "qwen2", "qwen3"]


def make_prompts(vocab_size: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation with its own KV cache, never stopping at EOS.

    A plain loop rather than `generate`, whose EOS handling (stop, or ban under
    min_new_tokens) would differ from `ignore_eos`."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens = []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens
