"""StableLM (2): LayerNorms with biases, biases on q/k/v where `use_qkv_bias`, partial rotary
(the first partial_rotary_factor of each head), optionally attention and the MLP side by
side off one norm (`use_parallel_residual`), optionally a LayerNorm over each head of q and
k (`qk_layernorm`: a module per head in the checkpoint, one [heads, head_dim] weight here)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch

from cadence.layers.norm import LayerNorm
from cadence.models.attention import AttentionOptions
from cadence.models.decoder import DecoderForCausalLM, ParallelLayer, PreNormLayer


class StableLmForCausalLM(DecoderForCausalLM):
    def __init__(self, config, backend, max_position: int) -> None:
        parallel = getattr(config, "use_parallel_residual", False)
        self.layer_kind = ParallelLayer if parallel else PreNormLayer
        super().__init__(config, backend, max_position)

    def attention_options(self, config, layer: int) -> AttentionOptions:
        options = super().attention_options(config, layer)
        qk_norm = "per_head" if getattr(config, "qk_layernorm", False) else None
        return replace(options, qkv_bias=bool(config.use_qkv_bias), o_bias=False, qk_norm=qk_norm)

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        super().load_weights(_stack_head_norms(weights))

    def make_norm(self, config, size: int):
        return LayerNorm(size, config.layer_norm_eps)


_HEAD_NORM = re.compile(r"(.*self_attn\.)(q|k)_layernorm\.norms\.(\d+)\.weight$")


def _stack_head_norms(weights: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
    """The checkpoint's `q_layernorm.norms.{h}.weight` (one LayerNorm per head) as one
    `q_norm.weight` [heads, head_dim] (and k's), after every other tensor."""
    heads: dict[str, dict[int, torch.Tensor]] = {}
    for name, source in weights:
        if (m := _HEAD_NORM.match(name)) is None:
            yield name, source
            continue
        prefix, which, head = m.groups()
        heads.setdefault(f"{prefix}{which}_norm.weight", {})[int(head)] = source[:]
    for name, per_head in heads.items():
        if sorted(per_head) != list(range(len(per_head))):
            raise ValueError(f"{name}: the checkpoint's per-head norms skip a head")
        yield name, torch.stack([per_head[h] for h in range(len(per_head))])
