"""Cadence: an LLM inference and serving engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.llm import LLM
    from cadence.lora_request import LoRARequest
    from cadence.outputs import CompletionOutput, RequestOutput
    from cadence.sampling_params import SamplingParams

__all__ = ["LLM", "LoRARequest", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"

# Imported on first use: the API server process imports `cadence.*` too and has no use for
# the engine (torch alone is about 1.5 s and 300 MB there).
_LAZY = {
    "LLM": "cadence.llm",
    "LoRARequest": "cadence.lora_request",
    "SamplingParams": "cadence.sampling_params",
    "RequestOutput": "cadence.outputs",
    "CompletionOutput": "cadence.outputs",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cadence' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
