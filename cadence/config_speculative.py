"""Speculative decoding's settings (`--speculative-config`), part of the engine's configuration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cadence.config_values import json_object

SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle3")


@dataclass
class SpeculativeConfig:
    """Speculative decoding, in vLLM's `--speculative-config` shape (a JSON object).

    Each step a proposer guesses up to `num_speculative_tokens` tokens per decoding request;
    the target model verifies them all in one forward pass (cadence/spec_decode/)."""

    method: str = "ngram"  # ngram (prompt lookup) | draft_model | eagle3
    num_speculative_tokens: int = 4  # draft tokens proposed per request and step (k)
    model: str | None = None  # draft_model: a smaller model (same tokenizer); eagle3: the heads
    prompt_lookup_min: int = 2  # ngram: the shortest suffix matched, in tokens
    prompt_lookup_max: int = 5  # ngram: the longest suffix matched, in tokens
    # No drafts while this many requests or more run in a step: at large batches a step
    # is compute-bound and verifying guesses costs more than it saves. None: always draft.
    disable_by_batch_size: int | None = None

    # vLLM's names for the same things, accepted as aliases.
    _ALIASES = {"eagle-3": "eagle3", "draft": "draft_model", "[ngram]": "ngram"}

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
        """From a dict, a JSON string (the CLI flag) or an instance; None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            value = json_object(value, "speculative_config")
        if not isinstance(value, dict):
            raise ValueError("speculative_config must be a JSON object")
        value = dict(value)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}; known: {sorted(names)}")
        if "method" not in value:
            # vLLM infers the method: a draft model if one is named, else n-gram lookup.
            value["method"] = "draft_model" if value.get("model") else "ngram"
        value["method"] = cls._ALIASES.get(value["method"], value["method"])
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs num_speculative_tokens")
        return cls(**value)

    def validate(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"unknown speculative method {self.method!r}; use one of {SPECULATIVE_METHODS}"
            )
        if not isinstance(self.num_speculative_tokens, int) or not (
            1 <= self.num_speculative_tokens <= 16
        ):
            raise ValueError("num_speculative_tokens must be an integer from 1 to 16")
        if self.method != "ngram" and not self.model:
            raise ValueError(f"speculative method {self.method} needs a model (its checkpoint)")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError("disable_by_batch_size must be positive")

    def describe(self) -> str:
        what = (
            self.model
            if self.method != "ngram"
            else (f"n = {self.prompt_lookup_min}..{self.prompt_lookup_max}")
        )
        return f"{self.method} ({what}), k = {self.num_speculative_tokens}"
