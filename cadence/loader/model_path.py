"""From a model name to its folder, without PyTorch (the API server process calls it at every
start, and imports nothing else of the loader)."""

from __future__ import annotations

import os
from pathlib import Path

from cadence.loader.gguf import convert_gguf, default_model_path


def resolve_model_path(model: str | None) -> str:
    path = model or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"model {path!r} does not exist (give a checkpoint folder with config.json, "
            "or a .gguf file; nothing is downloaded)"
        )
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return convert_gguf(path)
        raise ValueError(f"model {path!r} is a file but not a .gguf file")
    if not os.path.exists(os.path.join(path, "config.json")):
        ggufs = sorted(Path(path).glob("*.gguf"))
        if ggufs:
            return convert_gguf(str(ggufs[0]))
        raise FileNotFoundError(f"no config.json in {path!r}")
    return path
