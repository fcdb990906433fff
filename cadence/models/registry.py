"""Maps a checkpoint's config to our model class (cadence/models/architectures.py lists
them); a family's module is imported only when a model of it loads."""

from __future__ import annotations

import importlib

from torch import nn

from cadence.models.architectures import ARCHITECTURES, BY_MODEL_TYPE, supported_architectures


def resolve_model_class(config) -> type[nn.Module]:
    """The class for `config` (its `architectures`, else its `model_type`); ValueError
    naming the architecture and the supported list when Cadence has none."""
    archs = getattr(config, "architectures", None) or []
    if not archs:
        archs = [BY_MODEL_TYPE.get(getattr(config, "model_type", ""), "")]
    for arch in archs:
        if arch in ARCHITECTURES:
            module, name = ARCHITECTURES[arch]
            return getattr(importlib.import_module(f"cadence.models.{module}"), name)
    raise ValueError(
        f"unsupported model architecture {archs or getattr(config, 'model_type', None)!r}; "
        f"supported: {', '.join(supported_architectures())}"
    )
