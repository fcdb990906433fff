"""The rotary tables against transformers' own rotary modules, position by position."""

from __future__ import annotations

import torch
import transformers as tf
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from cadence.layers.rotary import RotaryEmbedding

HEAD_DIM = 16
ORIGINAL = 64  # the context LongRoPE's short factors were trained for
MAX_POSITION = 256


def _longrope_config() -> tf.Phi3Config:
    half = HEAD_DIM // 2
    return tf.Phi3Config(
        vocab_size=64,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        intermediate_size=64,
        pad_token_id=0,
        eos_token_id=1,
        max_position_embeddings=MAX_POSITION,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={  # Phi-3.5's kind, with factors far enough apart to tell
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.5 * i for i in range(half)],
            "original_max_position_embeddings": ORIGINAL,
        },
    )


def test_longrope_takes_short_factors_before_the_original_context_and_long_ones_after():
    """transformers picks one set for a whole sequence by its length; a paged cache keeps
    each key as it was rotated, so the table switches by position: short factors below
    the original context (what transformers computes for any sequence that fits in it),
    long ones from there on (what it computes for a longer one), the same scale on both."""
    config = _longrope_config()
    ours = RotaryEmbedding(config, HEAD_DIM, MAX_POSITION)
    reference = Phi3RotaryEmbedding(config)
    x = torch.zeros(1, 1, HEAD_DIM)
    short_cos, short_sin = reference(x, torch.arange(ORIGINAL)[None])
    long_cos, long_sin = reference(x, torch.arange(MAX_POSITION)[None])
    assert torch.equal(ours.cos[:ORIGINAL], short_cos[0])
    assert torch.equal(ours.sin[:ORIGINAL], short_sin[0])
    assert torch.equal(ours.cos[ORIGINAL:], long_cos[0, ORIGINAL:])
    assert torch.equal(ours.sin[ORIGINAL:], long_sin[0, ORIGINAL:])
    assert not torch.allclose(short_cos[0, 10], long_cos[0, 10])  # the two sets differ


def test_a_table_within_the_original_context_is_all_short_factors():
    config = _longrope_config()
    ours = RotaryEmbedding(config, HEAD_DIM, ORIGINAL)
    short_cos, _ = Phi3RotaryEmbedding(config)(
        torch.zeros(1, 1, HEAD_DIM), torch.arange(ORIGINAL)[None]
    )
    assert torch.equal(ours.cos, short_cos[0])
