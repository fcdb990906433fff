"""The interface every reasoning parser implements, and the streaming helper they share."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ReasoningParser(ABC):
    """Splits one sample's text, as it streams, into (thinking, answer) pieces.

    Subclasses set `needs_special_tokens` when their markers are special tokens (the
    text must then be detokenized with them kept), and their markers."""

    needs_special_tokens = False
    # The markers as text, for the engine: a structured output applies after `end_marker`,
    # and a thinking budget is kept by writing it (None: the format cannot be bounded).
    start_marker: str | None = None
    end_marker: str | None = None
    starts_thinking = False  # the template's prompt opens the thinking (DeepSeek-R1)

    @abstractmethod
    def feed(self, text: str) -> tuple[str, str]:
        """The (thinking, answer) that `text`, the sample's next piece, completes."""

    @abstractmethod
    def finish(self) -> tuple[str, str]:
        """What is still held back, at the sample's end."""


def split_reasoning(parser: ReasoningParser, text: str) -> tuple[str, str]:
    """(thinking, answer) of a whole text."""
    r1, c1 = parser.feed(text)
    r2, c2 = parser.finish()
    return r1 + r2, c1 + c2


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (what to
    hold back: the marker may be arriving)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
