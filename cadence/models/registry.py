"""Maps a checkpoint's `architectures` entry to our model class."""

from __future__ import annotations

from torch import nn

from cadence.models.llama import LlamaForCausalLM
from cadence.models.qwen2 import Qwen2ForCausalLM
from cadence.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def resolve_model_class(config) -> type[nn.Module]:
    archs = getattr(config, "architectures", None) or []
    if not archs:
        by_type = {
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
        }
        archs = [by_type.get(getattr(config, "model_type", ""), "")]
    for arch in archs:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(
        f"unsupported model architecture {archs or getattr(config, 'model_type', None)!r}; "
        f"supported: {', '.join(sorted(MODEL_REGISTRY))}"
    )
