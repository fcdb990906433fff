"""Structured outputs and thinking budgets for reasoning models: what the engine is told.

A reasoning model thinks before it answers; a JSON schema (or a forced tool call) is for
the answer. With a --reasoning-parser that names its markers, the request's constraint
carries the end marker's token ids (and the opener's, for a model that may skip thinking),
and the engine applies it after the thinking (structured/thinking.py); `max_thinking_tokens`
closes the thinking by force.

Not bounded: a prompt whose template already closed the thinking (Qwen3's
`enable_thinking: false`), and an opener that is not one token (tags spelled as text:
thinking cannot be told from an answer's first tokens) - the constraint then applies from
the first token, as without a parser.
"""

from __future__ import annotations

import dataclasses

from cadence.entrypoints.reasoning import ReasoningParser
from cadence.sampling_params import StructuredOutputsParams

_PROMPT_TAIL_TOKENS = 16  # enough to see a template's closed empty thinking block


def thinking_bounds(
    reasoning: type[ReasoningParser] | None,
    tokenizer,
    prompt_ids: list[int],
    constraint: StructuredOutputsParams | None,
    budget: int | None,
) -> StructuredOutputsParams | None:
    """`constraint` with the thinking bounds set, when they apply; else as it was.
    Raises ValueError when a budget is asked for and cannot be kept."""
    if constraint is None and budget is None:
        return None
    end_marker = reasoning.end_marker if reasoning is not None else None
    if end_marker is None or tokenizer is None:
        if budget is not None:
            raise ValueError("max_thinking_tokens needs a --reasoning-parser with markers")
        return constraint
    tail = tokenizer.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    if tail.rstrip().endswith(end_marker):
        return constraint  # the template closed the thinking: the answer starts now
    start = None
    if not reasoning.starts_thinking:
        start_ids = tokenizer.encode(reasoning.start_marker, add_special_tokens=False)
        if len(start_ids) != 1:
            if budget is not None:
                raise ValueError(
                    f"max_thinking_tokens: this tokenizer spells {reasoning.start_marker} as "
                    "text, so thinking cannot be told apart from the answer"
                )
            return constraint
        start = start_ids[0]
    end = tokenizer.encode(end_marker, add_special_tokens=False)
    return dataclasses.replace(
        constraint or StructuredOutputsParams(),
        thinking_end=end,
        thinking_start=start,
        max_thinking_tokens=budget,
    )
