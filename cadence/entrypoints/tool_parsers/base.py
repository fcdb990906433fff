"""The interface every tool-call parser implements, and the pieces they share.

A parser reads one sample's answer text as it streams and gives back pieces: content (a
`str`) or a `ToolCallDelta` (a call's id and name on its first piece, then the next
characters of its JSON arguments). Concatenated, a call's argument pieces are its
arguments' JSON text.

Two modes, one code path: streaming (`incremental=True`) commits a call as soon as its
name and the start of its arguments are seen, then streams the arguments as they come;
whole-text parsing (`incremental=False`, `parse_tool_calls`) commits a call only when its
block is complete and parses, so a malformed call comes back as text.
"""

from __future__ import annotations

import json
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cadence.entrypoints.reasoning.base import partial_suffix


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def mistral_call_id() -> str:
    """Mistral's templates refuse a tool_call_id that is not 9 letters or digits."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=new_call_id)

    def to_openai(self, index: int | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ToolCallDelta:
    """One piece of a streamed call: `index` counts the sample's calls from 0; `id` and
    `name` come on a call's first piece only."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Piece = str | ToolCallDelta


class ToolParser(ABC):
    """Splits one sample's answer into content and tool calls, as it streams.

    Subclasses set `needs_special_tokens` when their markers are special tokens (the text
    must then be detokenized with them kept), and `make_id` for their format's call ids."""

    needs_special_tokens = False
    make_id: Callable[[], str] = staticmethod(new_call_id)
    call_separator = "\n"  # between two calls a grammar forces (see call_text)

    @classmethod
    def call_text(cls, name: str) -> tuple[str, str] | None:
        """The text this format writes before and after a call's JSON arguments, for a
        grammar that forces calls (tool_choice required / named) in the model's own
        format. None: its markers are special tokens no grammar writes as text; forced
        calls are then a JSON array (json_array.py)."""
        return None

    def __init__(
        self, parameters: Mapping[str, dict] | None = None, incremental: bool = True
    ) -> None:
        """`parameters`: each tool's JSON schema by function name (formats that write
        arguments as text read their types from it)."""
        self.parameters = dict(parameters or {})
        self.incremental = incremental
        self.num_calls = 0
        self.pending = ""  # text fed but not yet read (a marker may be arriving)
        self.raw = ""  # the call section read so far: given back as text if it fails

    @abstractmethod
    def feed(self, text: str) -> list[Piece]:
        """The pieces that `text`, the answer's next characters, completes."""

    @abstractmethod
    def finish(self) -> list[Piece]:
        """What is still held back, at the sample's end (an unclosed last call is kept
        when it parses, else given back as text)."""

    # ---- helpers for subclasses ---------------------------------------------------------

    def text_until(self, marker: str) -> tuple[str, bool]:
        """Read from `pending` up to `marker` (which is consumed): (the text, whether the
        marker came). Without it, all but what may be the marker's start is read. Content
        up to a call's opener, or a call's body up to its closer."""
        at = self.pending.find(marker)
        if at < 0:
            keep = partial_suffix(self.pending, marker)
            text = self.pending[: len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep :]
            return text, False
        text, self.pending = self.pending[:at], self.pending[at + len(marker) :]
        return text, True

    def take(self, n: int) -> None:
        """Move `n` characters of `pending` into the call section's `raw` text."""
        self.raw += self.pending[:n]
        self.pending = self.pending[n:]

    def open_call(self, name: str, arguments: str = "") -> ToolCallDelta:
        """The first piece of a new call."""
        delta = ToolCallDelta(self.num_calls, arguments, self.make_id(), name)
        self.num_calls += 1
        return delta

    def more(self, arguments: str) -> list[Piece]:
        """More arguments of the call opened last (nothing when empty)."""
        return [ToolCallDelta(self.num_calls - 1, arguments)] if arguments else []

    def whole_call(self, call: ToolCall) -> ToolCallDelta:
        return self.open_call(call.name, call.arguments)


def parse_tool_calls(parser: ToolParser, text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer; content is stripped when there are calls."""
    pieces = parser.feed(text) + parser.finish()
    content, calls = collect(pieces)
    return (content.strip() if calls else content), calls


def collect(pieces: list[Piece]) -> tuple[str, list[ToolCall]]:
    """Pieces put back together: the content, and each call whole."""
    content: list[str] = []
    calls: dict[int, ToolCall] = {}
    for p in pieces:
        if isinstance(p, str):
            content.append(p)
        elif p.index in calls:
            calls[p.index].arguments += p.arguments
        else:
            calls[p.index] = ToolCall(p.name or "", p.arguments, p.id or new_call_id())
    return "".join(content), [calls[i] for i in sorted(calls)]


# ---- JSON helpers ---------------------------------------------------------------------


def arguments_object(arguments: Any) -> Any:
    """Templates expect a call's arguments as a mapping; OpenAI sends JSON text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def call_from_object(obj: Any, make_id: Callable[[], str] = new_call_id) -> ToolCall | None:
    """{"name": ..., "arguments": {...}} (or "parameters", or arguments as JSON text)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = arguments_object(obj.get("arguments", obj.get("parameters", {})))
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), make_id())


def call_from_json(text: str, make_id: Callable[[], str] = new_call_id) -> ToolCall | None:
    try:
        return call_from_object(json.loads(text), make_id)
    except json.JSONDecodeError:
        return None


def arguments_json(text: str) -> str | None:
    """`text` as a JSON object's normalized text, or None when it is not one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None
