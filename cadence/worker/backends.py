"""Which attention backend a model runs with (the target's, and a draft model's own)."""

from __future__ import annotations

import logging
import os

import torch

from cadence.attention.base import AttentionBackend
from cadence.attention.cpu_paged import CpuPagedAttentionBackend
from cadence.attention.torch_ref import TorchAttentionBackend
from cadence.layers.linear import local_kv_heads
from cadence.models.decoder import layer_window
from cadence.ops import cpu_ops

logger = logging.getLogger(__name__)


def beyond_triton(hf_config, max_model_len: int | None = None) -> str | None:
    """What a model needs that the Triton kernels do not do yet, from its config (None:
    nothing): the layers' windows as the model reads them, where shorter than
    max_model_len (a longer one is no window)."""
    if getattr(hf_config, "attn_logit_softcapping", None):
        return "soft-capped attention scores"
    limit = max_model_len or getattr(hf_config, "max_position_embeddings", None) or 0
    layers = range(getattr(hf_config, "num_hidden_layers", 0))
    windows = {w for i in layers if (w := layer_window(hf_config, i)) is not None and w < limit}
    return f"a sliding window of {min(windows)} tokens" if windows else None


def make_attention_backend(
    name: str, device: torch.device, hf_config, max_model_len: int | None = None
) -> AttentionBackend:
    """`name` (auto: triton on CUDA, or torch for a model that needs what the Triton
    kernels lack; on the CPU the paged C++ kernel where it builds, else torch) for a model
    of `hf_config`."""
    if name == "auto":
        if device.type == "cuda" and (lack := beyond_triton(hf_config, max_model_len)):
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

    kv_heads = getattr(hf_config, "num_key_value_heads", None)
    kv_heads = local_kv_heads(kv_heads or hf_config.num_attention_heads)
    return TritonAttentionBackend(num_kv_heads=kv_heads)
