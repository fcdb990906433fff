"""A GGUF file's tensors under Hugging Face's names, without expanding them (or expanded, for
the float path).

Quantized tensors come out as `GgufTensor` (their raw blocks, memory-mapped), float ones as
torch tensors. GGUF stores a weight [out, in] with its shape reversed (ne0 = in) and, for
the Llama architecture, the rows of q_proj and k_proj permuted (llama.cpp's converter
interleaves each head's two rotary halves); rows are independent in every block format,
so the permutation is undone on the raw rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch

from cadence.loader.gguf_arch import BLOCK_NAMES, NORM_PLUS_ONE, PERMUTED_QK, SKIPPED
from cadence.loader.gguf_index import GgufIndex
from cadence.quant.gguf_blocks import BLOCKS
from cadence.quant.gguf_packed import GgufTensor

logger = logging.getLogger(__name__)

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# A mixture of experts (Mixtral, stored as "llama"; Qwen2-MoE; Qwen3-MoE): the router, a
# shared expert and its sigmoid gate (Qwen2-MoE), and every expert's weight in one stack
# [E, out, in], named as cadence/models/moe.py's FusedExperts loads stacks (no ".weight").
_MOE = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_STACKS = {
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# Older files (llama.cpp before its stacks) hold Mixtral's experts one by one:
# blk.N.ffn_gate.E.weight.
_ONE_EXPERT = {"ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
_ROW_VECTORS = frozenset({"ffn_gate_inp_shexp"})  # stored [H]; Hugging Face's weight is [1, H]
# Plain float parameters in the model (routers are not quantized layers): expanded if a
# file quantized them (llama.cpp keeps them float32).
_ROUTERS = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp"})
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def hf_name(name: str, arch: str = "llama") -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (None: unknown),
    in `arch`'s layout (gguf_arch.BLOCK_NAMES)."""
    stem, _, kind = name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) < 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    layer, piece = f"model.layers.{parts[1]}", parts[2]
    block = {**_BLOCK, **_MOE, **BLOCK_NAMES.get(arch, {})}
    if len(parts) == 3 and piece in _STACKS and kind == "weight":
        return f"{layer}.{_STACKS[piece]}"
    if len(parts) == 3 and piece in block:
        return f"{layer}.{block[piece]}.{kind}"
    if len(parts) == 4 and piece in _ONE_EXPERT and parts[3].isdigit():
        return f"{layer}.mlp.experts.{parts[3]}.{_ONE_EXPERT[piece]}.{kind}"
    return None


def file_arch(index: GgufIndex) -> str:
    """The file's `general.architecture` (llama where it says none)."""
    return str(index.scalar("general.architecture") or "llama")


def rotary_unpermutation(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's permuted q/k rows back into HF's: within each head
    GGUF holds rows (i, half) interleaved where HF holds (half, i)."""
    idx = np.arange(rows).reshape(heads, rows // heads // 2, 2)
    return idx.swapaxes(1, 2).reshape(-1)


def iter_gguf(path: str, hf_config, expand: bool = False) -> Iterator[tuple[str, object]]:
    """(HF name, GgufTensor or torch tensor) for every tensor of the file; `expand`: every
    tensor as a float32 torch tensor (gguf-py's dequantization: the float path)."""
    index = GgufIndex(path)
    arch = file_arch(index)
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    permuted = {"attn_q": heads, "attn_k": kv_heads} if arch in PERMUTED_QK else {}
    for t in index.tensors:
        # What the model took of the previous tensor it copied: the file pages it read
        # need not stay resident (for SmolLM2 they added ~90 MiB to the load's peak).
        index.drop_resident_pages()
        name = hf_name(t.name, arch)
        if name is None:
            if t.name.rpartition(".")[0] not in SKIPPED:
                logger.info("GGUF tensor %s has no place in the model; skipped", t.name)
            continue
        kind = t.tensor_type.name
        shape = tuple(reversed(t.shape))  # [out, in]
        data = t.data
        piece = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        perm = rotary_unpermutation(shape[0], permuted[piece]) if piece in permuted else None
        if piece in _ROW_VECTORS:
            shape = (1, *shape)
        if kind in _FLOATS:
            tensor = torch.from_numpy(np.array(data))  # a copy: the map is read-only
            tensor = tensor.view(_FLOATS[kind]).reshape(shape)  # (BF16 arrives as bytes)
            if arch in NORM_PLUS_ONE and name.endswith("norm.weight"):
                tensor = tensor - 1  # stored as 1 + w: Gemma's norms add the 1 themselves
            yield name, tensor[torch.from_numpy(perm)] if perm is not None else tensor
        elif kind in BLOCKS and not expand and piece not in _ROUTERS:
            raw = data if perm is None else data[perm]
            yield name, GgufTensor(kind, raw, shape)
        else:
            from gguf.quants import dequantize

            if not expand and piece not in _ROUTERS:
                logger.info(
                    "GGUF %s tensor %s: expanded to float32 (not kept packed)", kind, t.name
                )
            tensor = torch.from_numpy(dequantize(data, t.tensor_type)).reshape(shape)
            yield name, tensor[torch.from_numpy(perm)] if perm is not None else tensor
    index.drop_resident_pages()
