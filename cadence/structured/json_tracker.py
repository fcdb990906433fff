"""Follows a JSON text as it is generated and reports each value as it completes.

    tracker = JsonTracker()
    events = tracker.feed('{"tags": ["a", "b"')    [((("tags", 0), "a")), ((("tags", 1), "b"))]
    events = tracker.end()                          the root, if a number ends the text

An event is (path, value, earlier): the path of keys and indices from the root, the value
parsed, and for an array's item the items before it (else None).
The input is trusted to be JSON (a grammar produced it): the tracker does not validate.
`clone()` is cheap (containers are copied only when a clone would change them), so a
caller can try a token on a clone and throw it away.
"""

from __future__ import annotations

import json
from typing import Any

Path = tuple[str | int, ...]
Event = tuple[Path, Any, list | None]

_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"true": True, "false": False, "null": None}


class _Frame:
    """An open object or array: its value so far, and (objects) the key being filled."""

    __slots__ = ("key", "owned", "value")

    def __init__(self, value: dict | list) -> None:
        self.value = value
        self.key: str | None = None  # objects: the key whose value comes next
        self.owned = True  # False in a clone until it first writes (copy on write)

    def copy(self) -> _Frame:
        f = _Frame(self.value)
        f.key, f.owned = self.key, False
        return f

    def add(self, item: Any) -> None:
        if not self.owned:
            self.value = self.value.copy()
            self.owned = True
        if isinstance(self.value, list):
            self.value.append(item)
        else:
            self.value[self.key] = item
            self.key = None


class JsonTracker:
    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.scalar: str | None = None  # a string (its raw JSON text, quotes included),
        #                                 a number or a literal being written
        self.escape = False
        self.expect_key = False  # in an object, the next string is a key
        self.done = False  # the root value is complete

    def clone(self) -> JsonTracker:
        t = JsonTracker.__new__(JsonTracker)
        t.stack = [f.copy() for f in self.stack]
        t.scalar, t.escape, t.expect_key, t.done = (
            self.scalar,
            self.escape,
            self.expect_key,
            self.done,
        )
        return t

    @property
    def in_string(self) -> bool:
        return self.scalar is not None and self.scalar.startswith('"')

    @property
    def in_bare_scalar(self) -> bool:
        """A number or literal is being written: the next non-number character ends it."""
        return self.scalar is not None and not self.scalar.startswith('"')

    def path(self) -> Path:
        """Where the value being written sits."""
        out: list[str | int] = []
        for f in self.stack:
            out.append(len(f.value) if isinstance(f.value, list) else f.key or "")
        return tuple(out)

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        for ch in text:
            if self.scalar is not None:
                if self.in_string:
                    self.scalar += ch
                    if self.escape:
                        self.escape = False
                    elif ch == "\\":
                        self.escape = True
                    elif ch == '"':
                        self._complete(json.loads(self.scalar), events)
                    continue
                if ch in _NUMBER_CHARS or self.scalar[:1].isalpha() and ch.isalpha():
                    self.scalar += ch
                    continue
                self._end_bare(events)
            if ch == '"':
                self.scalar = '"'
            elif ch == "{":
                self.stack.append(_Frame({}))
                self.expect_key = True
            elif ch == "[":
                self.stack.append(_Frame([]))
            elif ch in "}]":
                if self.stack:
                    frame = self.stack.pop()
                    self.expect_key = False
                    self._complete(frame.value, events)
            elif ch == ",":
                self.expect_key = bool(self.stack) and isinstance(self.stack[-1].value, dict)
            elif ch in "-0123456789tfn":
                self.scalar = ch
        return events

    def end(self) -> list[Event]:
        """The text ended: a number or literal at its end completes."""
        events: list[Event] = []
        if self.in_bare_scalar:
            self._end_bare(events)
        return events

    def _end_bare(self, events: list[Event]) -> None:
        text = self.scalar
        self.scalar = None
        if text in _LITERALS:
            value: Any = _LITERALS[text]
        else:
            try:
                value = json.loads(text)
            except ValueError:
                return  # (not JSON: the grammar would not have let it through)
        self._complete(value, events)

    def _complete(self, value: Any, events: list[Event]) -> None:
        self.scalar = None
        if self.stack and self.expect_key and isinstance(self.stack[-1].value, dict):
            self.stack[-1].key = value  # a key, not a value
            self.expect_key = False
            return
        parent = self.stack[-1].value if self.stack else None
        earlier = parent[:] if isinstance(parent, list) else None
        events.append((self.path(), value, earlier))
        if self.stack:
            self.stack[-1].add(value)
        else:
            self.done = True
