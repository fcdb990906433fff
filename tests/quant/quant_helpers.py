"""Shared by the quantization tests: layers built in a given format."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from cadence.quant.base import QuantMethod, quant_scope

T = TypeVar("T")


def built_in(quant: QuantMethod, factory: Callable[[], T], dtype: torch.dtype) -> T:
    """factory(), every layer it creates taking `quant`'s methods, in `dtype` (the default
    dtype while it runs, as the loader sets it)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with quant_scope(quant):
            return factory()
    finally:
        torch.set_default_dtype(prev)
