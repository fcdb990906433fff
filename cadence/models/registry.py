"""Maps a checkpoint's config to our model class (cadence/models/architectures.py lists
them); a family's module is imported only when a model of it loads."""

from __future__ import annotations

import importlib

from torch import nn

from cadence.models.architectures import ARCHITECTURES, BY_MODEL_TYPE, supported_architectures
from cadence.models.vision_language import VisionLanguageModel, compose


def _load(arch: str) -> type[nn.Module]:
    module, name = ARCHITECTURES[arch]
    return getattr(importlib.import_module(f"cadence.models.{module}"), name)


def _with_language_model(family, config) -> type[nn.Module]:
    """A vision-language family over its language model's decoder class: the one the
    family names, else the one of the (language) config's model_type."""
    arch = family.language_model or BY_MODEL_TYPE.get(getattr(config, "model_type", ""), "")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{family.__name__} over a {getattr(config, 'model_type', None)!r} language model "
            "is not supported"
        )
    return compose(family, _load(arch))


def resolve_model_class(config) -> type[nn.Module]:
    """The class for `config` (its `architectures`, else its `model_type`); ValueError
    naming the architecture and the supported list when Cadence has none."""
    archs = getattr(config, "architectures", None) or []
    if not archs:
        archs = [BY_MODEL_TYPE.get(getattr(config, "model_type", ""), "")]
    for arch in archs:
        if arch in ARCHITECTURES:
            cls = _load(arch)
            if issubclass(cls, VisionLanguageModel):  # composed over its language model
                return _with_language_model(cls, config)
            return cls
    raise ValueError(
        f"unsupported model architecture {archs or getattr(config, 'model_type', None)!r}; "
        f"supported: {', '.join(supported_architectures())}"
    )
