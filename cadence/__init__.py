"""Cadence: an LLM inference and serving engine."""

from cadence.llm import LLM
from cadence.outputs import CompletionOutput, RequestOutput
from cadence.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
