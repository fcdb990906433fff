"""Per-request sampling parameters, validated once at the door.

Every check lives in `SamplingParams.verify()`; the engine calls it before a request enters
the queue, so a bad value is a clear `ValueError` for that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Past this, a temperature is treated as greedy (a division by ~0 would give inf logits).
_GREEDY_EPS = 1e-5


@dataclass
class StructuredOutputsParams:
    """What the output must match: exactly one of json, json_object, regex, choice, grammar,
    structural_tag.

    `json` is a JSON schema (a dict or its JSON text). `grammar` is EBNF in xgrammar's
    GBNF-style dialect (`root ::= ...`); a Lark grammar is accepted too. By default JSON is
    written without free whitespace (one space after `:` and `,`): small models otherwise
    loop on newlines until max_tokens. `any_whitespace=True` allows any whitespace between
    JSON tokens, bounded by `max_whitespace` characters per run when that is set.
    """

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None  # xgrammar's structural tag (JSON text): tool calls
    any_whitespace: bool = False
    max_whitespace: int | None = None
    # A JSON schema with keywords no grammar expresses (uniqueItems, a lookahead, not ...):
    # strict refuses it (OpenAI's `strict: true`); otherwise the grammar enforces what it
    # can and the rest is checked as values complete (structured/checked.py).
    strict: bool = False
    # A reasoning model's thinking is free; the constraint applies to what follows it
    # (structured/thinking.py). Thinking ends at the token ids `thinking_end`;
    # `thinking_start` is the one token that opens it at the output's start (None: the
    # prompt opened it, the output starts inside); past `max_thinking_tokens` it is closed
    # by force. With none of json ... grammar given, the answer is free (kind "free").
    thinking_end: list[int] | None = None
    thinking_start: int | None = None
    max_thinking_tokens: int | None = None

    @property
    def kind(self) -> str:
        kinds = [
            name
            for name, given in (
                ("json", self.json is not None),
                ("json_object", self.json_object),
                ("regex", self.regex is not None),
                ("choice", self.choice is not None),
                ("grammar", self.grammar is not None),
                ("structural_tag", self.structural_tag is not None),
            )
            if given
        ]
        if not kinds and self.thinking_end:
            return "free"
        if len(kinds) != 1:
            raise ValueError(
                "structured outputs take exactly one of json, json_object, regex, choice, "
                f"grammar, structural_tag; got {', '.join(kinds) if kinds else 'none'}"
            )
        return kinds[0]

    def verify(self) -> None:
        kind = self.kind
        if kind == "choice" and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError("choice must be a non-empty list of non-empty strings")
        if kind == "json" and not isinstance(self.json, dict | str):
            raise ValueError("json must be a JSON schema (an object or its JSON text)")
        if kind in ("regex", "grammar", "structural_tag") and not getattr(self, kind).strip():
            raise ValueError(f"{kind} must not be empty")
        if self.thinking_end is not None and (
            not self.thinking_end or not all(isinstance(t, int) for t in self.thinking_end)
        ):
            raise ValueError("thinking_end must be a non-empty list of token ids")
        if self.max_thinking_tokens is not None and (
            not isinstance(self.max_thinking_tokens, int) or self.max_thinking_tokens < 0
        ):
            raise ValueError(
                f"max_thinking_tokens must be a non-negative integer, got {self.max_thinking_tokens!r}"
            )
        if self.max_whitespace is not None and (
            not isinstance(self.max_whitespace, int) or self.max_whitespace < 0
        ):
            raise ValueError(
                f"max_whitespace must be a non-negative integer, got {self.max_whitespace!r}"
            )


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: list[str] | str | None = None  # stop strings: applied by the output processor
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token's and top k
    # None: off; k >= 0: each prompt token's own logprob and the top k at its position (the
    # first prompt token has none). Such a request computes its whole prompt: no prefix hits.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None  # constrain the output
    # Disaggregated prefill/decode (cadence/kv_transfer/connector.py; the router sets it)
    kv_transfer_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def verify(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the first bad field."""

        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1 or self.n > 128:
            bad("n", "must be an integer in [1, 128]")
        if not 0.0 <= self.temperature <= 100.0:
            bad("temperature", "must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if not isinstance(self.top_k, int):
            bad("top_k", "must be an integer")
        if vocab_size is not None and self.top_k > vocab_size:
            bad("top_k", f"must be at most the vocabulary size {vocab_size}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            bad("repetition_penalty", "must be in (0, 10]")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            bad("max_tokens", "must be a positive integer")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", "must be a non-negative integer")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be at most max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (
                not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20
            ):
                bad(name, "must be an integer in [0, 20]")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "must be an integer")
        for tid in self.stop_token_ids:
            if tid < 0 or (vocab_size is not None and tid >= vocab_size):
                raise ValueError(f"stop_token_ids holds {tid}, outside the vocabulary")
        for tid, bias in (self.logit_bias or {}).items():
            if int(tid) < 0 or (vocab_size is not None and int(tid) >= vocab_size):
                raise ValueError(f"logit_bias names token {tid}, outside the vocabulary")
            if not -100.0 <= float(bias) <= 100.0:
                raise ValueError(f"logit_bias for token {tid} must be in [-100, 100], got {bias}")
        if self.structured_outputs is not None:
            self.structured_outputs.verify()

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
