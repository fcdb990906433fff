"""Granite-MoE (3.0 / 3.1 MoE) and Granite-MoE-Shared: Granite 3's scalars (granite.py)
around a mixture of experts in every layer: softmax over the top-k router logits (the
same as the top-k of the softmax, renormalised), the weights cast to the activations'
dtype. Checkpoints keep every expert in one tensor (`input_linear` [E, 2I, H]: gate rows,
then up; `output_linear` [E, H, I]); the Shared variant adds an ungated dense MLP
(`shared_mlp`) beside the experts."""

from __future__ import annotations

from torch import nn

from cadence.models.granite import GraniteForCausalLM
from cadence.models.moe import MoEOptions, SparseMoE

# checkpoint name piece -> ours (the original names, then transformers 5's own)
_RENAMES = (
    (".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
    (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
    (".block_sparse_moe.router.layer.weight", ".mlp.gate.weight"),
    (".block_sparse_moe.router.weight", ".mlp.gate.weight"),
    (".block_sparse_moe.experts.", ".mlp.experts."),
    (".shared_mlp.input_linear.", ".mlp.shared_expert.gate_up_proj."),
    (".shared_mlp.output_linear.", ".mlp.shared_expert.down_proj."),
)


class GraniteMoeForCausalLM(GraniteForCausalLM):
    prefused_names = frozenset({"gate_up_proj"})  # the shared MLP's input_linear

    def make_mlp(self, config, layer: int) -> nn.Module:
        options = MoEOptions(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.intermediate_size,
            renormalize=True,
            shared_intermediate_size=getattr(config, "shared_intermediate_size", 0) or 0,
            shared_gate=False,
        )
        return SparseMoE(config, options)

    def checkpoint_name(self, name: str) -> str | None:
        for theirs, ours in _RENAMES:
            if theirs in name:
                return name.replace(theirs, ours)
        return name


class GraniteMoeSharedForCausalLM(GraniteMoeForCausalLM):
    pass
