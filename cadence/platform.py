"""Which device the engine runs on: the one place that asks torch what hardware is here."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """`auto`: the GPU when there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_type(name: str) -> str:
    """ "cuda" or "cpu" (or another torch device type) for a --device value."""
    return pick_device(name).type
