"""One call's JSON, followed as it streams: the shared engine of the JSON formats.

    stream = JsonCallStream(parser)            a call object {"name": ..., "arguments": {...}}
    stream = JsonCallStream(parser, "f")       the arguments object of a call named "f"
    pieces = stream.feed(text)                 what `text` completes (stream.used: how much
                                               of it was the call's; stream.done: it ended)
    pieces, ok = stream.read()                 the same, from the parser's pending text
    pieces, ok = stream.close()                at the block's end: ok False = not a call

Streaming, a call is committed (its first piece out) once its name and the `{` of its
arguments are seen; the arguments then go out as they arrive. Otherwise (another key order,
whole-text parsing) the call comes out whole when its object closes and parses.
"""

from __future__ import annotations

import json
import re

from cadence.entrypoints.tool_parsers.base import (
    Piece,
    ToolParser,
    arguments_json,
    call_from_json,
)

# A call object's head up to its arguments: {"name": "f", "arguments": (or "parameters")
_CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


def call_head(text: str) -> tuple[str, int] | None:
    """(name, where its arguments object starts) when `text` opens a call object."""
    m = _CALL_HEAD.match(text)
    if m is None:
        return None
    try:
        return json.loads(f'"{m.group(1)}"'), m.end()
    except json.JSONDecodeError:
        return None


class JsonValueScanner:
    """Follows one JSON object's text as it arrives and says where it ends: braces and
    brackets counted outside strings (escapes honoured). It does not validate."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False

    def scan(self, text: str) -> int:
        """How many characters of `text` belong to the value (all, or up to its end)."""
        if self.done:
            return 0
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                if self.started and self.depth == 0:
                    return i + 1
        return len(text)

    @property
    def done(self) -> bool:
        return self.started and self.depth == 0


class JsonCallStream:
    def __init__(self, parser: ToolParser, name: str | None = None) -> None:
        self.parser = parser
        self.name = name  # None: the text is a whole call object
        self.text = ""  # the object so far
        self.outer = JsonValueScanner()  # the whole object
        self.args = JsonValueScanner()  # the arguments, once committed
        self.args_at: int | None = None  # where the arguments start in self.text
        self.sent = 0  # characters of self.text sent as arguments (committed only)
        self.used = 0  # of the last feed's text
        self.committed = False

    @property
    def done(self) -> bool:
        return self.outer.done

    def feed(self, text: str) -> list[Piece]:
        self.used = self.outer.scan(text)
        self.text += text[: self.used]
        if not self.parser.incremental:
            return []
        out: list[Piece] = []
        if not self.committed:
            if self.name is not None:
                start = self.text.find("{")
                head = (self.name, start) if start >= 0 else None
            else:
                head = call_head(self.text)
            if head is None:
                return []
            name, self.args_at = head
            self.committed = True
            self.sent = self.args_at
            out.append(self.parser.open_call(name))
        # The arguments end at their own closing brace (a call object's own `}` follows).
        end = self.sent + self.args.scan(self.text[self.sent :])
        out += self.parser.more(self.text[self.sent : end])
        self.sent = end
        return out

    def read(self) -> tuple[list[Piece], bool | None]:
        """Feed it the parser's pending text (which moves to the parser's `raw`): the pieces,
        and None while the call is open, then True at its end, or False: no call."""
        out = self.feed(self.parser.pending)
        self.parser.take(self.used)
        if not self.done:
            return out, None
        pieces, ok = self.close()
        return out + pieces, ok

    def close(self) -> tuple[list[Piece], bool]:
        """At the end of its block: ([], True) when it was streamed; the whole call when it
        parses; ([], False) when it is not a call."""
        if self.committed:
            return [], True
        if self.name is None:
            call = call_from_json(self.text, self.parser.make_id)
            if call is None:
                return [], False
            return [self.parser.whole_call(call)], True
        arguments = arguments_json(self.text)
        if arguments is None:
            return [], False
        return [self.parser.open_call(self.name, arguments)], True
