"""A GGUF file's tensors under Hugging Face's names, without expanding them.

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
from cadence.quant.gguf import GgufTensor
from cadence.quant.gguf_blocks import BLOCKS

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
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def hf_name(name: str, arch: str = "llama") -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (None: unknown),
    in `arch`'s layout (gguf_arch.BLOCK_NAMES)."""
    stem, _, kind = name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    parts = stem.split(".")
    block = {**_BLOCK, **BLOCK_NAMES.get(arch, {})}
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in block:
        return f"model.layers.{parts[1]}.{block[parts[2]]}.{kind}"
    return None


def file_arch(index: GgufIndex) -> str:
    """The file's `general.architecture` (llama where it says none)."""
    return str(index.scalar("general.architecture") or "llama")


def rotary_unpermutation(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's permuted q/k rows back into HF's: within each head
    GGUF holds rows (i, half) interleaved where HF holds (half, i)."""
    idx = np.arange(rows).reshape(heads, rows // heads // 2, 2)
    return idx.swapaxes(1, 2).reshape(-1)


def iter_gguf(path: str, hf_config) -> Iterator[tuple[str, object]]:
    """(HF name, GgufTensor or torch tensor) for every tensor of the file."""
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
        if kind in _FLOATS:
            tensor = torch.from_numpy(np.array(data))  # a copy: the map is read-only
            tensor = tensor.view(_FLOATS[kind]).reshape(shape)  # (BF16 arrives as bytes)
            if arch in NORM_PLUS_ONE and name.endswith("norm.weight"):
                tensor = tensor - 1  # stored as 1 + w: Gemma's norms add the 1 themselves
            yield name, tensor[torch.from_numpy(perm)] if perm is not None else tensor
        elif kind in BLOCKS:
            raw = data if perm is None else data[perm]
            yield name, GgufTensor(kind, raw, shape)
        else:
            from gguf.quants import dequantize

            logger.info("GGUF %s tensor %s: expanded to float32 (not kept packed)", kind, t.name)
            tensor = torch.from_numpy(dequantize(data, t.tensor_type)).reshape(shape)
            yield name, tensor[torch.from_numpy(perm)] if perm is not None else tensor
    index.drop_resident_pages()
