"""Phi-3 / 3.5 / 4-mini: Llama's layout, checkpoints that store q/k/v and gate/up already
fused (`qkv_proj`, `gate_up_proj`: split into our shards on load), a sliding window on every
layer, partial rotary on Phi-4-mini."""

from __future__ import annotations

from cadence.models.decoder import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    prefused_names = frozenset({"qkv_proj", "gate_up_proj"})
