"""Which attention backend a model runs with (the target's, and a draft model's own)."""

from __future__ import annotations

import logging
import os

import torch

from cadence.attention.base import AttentionBackend
from cadence.attention.cpu_paged import CpuPagedAttentionBackend
from cadence.attention.torch_ref import TorchAttentionBackend
from cadence.layers.linear import local_kv_heads
from cadence.models.attention import head_dim_of
from cadence.models.mla import latent_kv_dim
from cadence.ops import cpu_ops

logger = logging.getLogger(__name__)


def beyond_triton(hf_config) -> str | None:
    """What a model needs that the Triton kernels do not do, from its config (None:
    nothing). Windows, soft-caps and head dims that are not powers of two they do; a head
    wider than their tiles fit, or of an odd width, they do not."""
    from cadence.attention.triton_paged import MAX_HEAD_DIM  # triton, only where asked

    if latent_kv_dim(hf_config) is not None:  # triton_mla's tiles: powers of two
        dims = (hf_config.kv_lora_rank, hf_config.qk_rope_head_dim)
        if any(d < 16 or d & (d - 1) for d in dims):
            return f"a latent of {dims[0]} + {dims[1]} dims (not powers of two from 16)"
        return None
    head_dim = head_dim_of(hf_config)
    if head_dim > MAX_HEAD_DIM or head_dim % 2 or head_dim < 16:
        return f"a head dim of {head_dim}"
    return None


def make_attention_backend(name: str, device: torch.device, hf_config) -> AttentionBackend:
    """`name` (auto: triton on CUDA, or torch for a model that needs what the Triton
    kernels lack; on the CPU the paged C++ kernel where it builds, else torch) for a model
    of `hf_config`."""
    if name == "auto":
        if device.type == "cuda" and (lack := beyond_triton(hf_config)):
            logger.warning(
                "this model needs %s, which the Triton kernels do not do yet: attention runs "
                "on the torch backend (correct, slower; no CUDA graphs)",
                lack,
            )
            name = "torch"
        elif device.type == "cuda":
            name = "triton"
        else:
            name = "cpu" if device.type == "cpu" and cpu_ops.ops() is not None else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu":
        if device.type != "cpu" or cpu_ops.ops() is None:
            raise ValueError("the cpu attention backend needs a CPU device and its C++ kernels")
        return CpuPagedAttentionBackend()
    if device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
        raise ValueError("the triton attention backend needs a CUDA device")
    from cadence.attention.triton_paged import TritonAttentionBackend

    if latent_kv_dim(hf_config) is not None:  # one latent head; triton_mla splits keys
        if lack := beyond_triton(hf_config):  # (asked for by name: auto chose torch)
            raise ValueError(f"the triton attention backend cannot run {lack}")
        return TritonAttentionBackend(num_kv_heads=1, split_kv=False)
    kv_heads = getattr(hf_config, "num_key_value_heads", None)
    kv_heads = local_kv_heads(kv_heads or hf_config.num_attention_heads)
    return TritonAttentionBackend(num_kv_heads=kv_heads, head_dim=head_dim_of(hf_config))
