"""GPT-OSS's harmony format: a function call is a message to a recipient,

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(the recipient may also stand before `<|channel|>`). Messages without a `functions.`
recipient are content: their bodies, without markers or headers. With `--reasoning-parser
gpt_oss` the analysis channel never reaches here (it is thinking); without it, it is
content too. A call whose arguments do not parse is given back as text."""

from __future__ import annotations

import re

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream

_MARKER = re.compile(r"<\|(\w+)\|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_HEADER_STARTS = ("start", "channel")  # a marker that opens a message's header
_BODY_ENDS = ("end", "call", "return")


class HarmonyToolParser(ToolParser):
    needs_special_tokens = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = "body"  # header (to <|message|>) | body | call (a call's arguments)
        self.header = ""
        self.call: JsonCallStream | None = None

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            at = self.pending.find("<|")
            piece = self.pending if at < 0 else self.pending[:at]
            if at < 0 and piece.endswith("<"):
                piece = piece[:-1]
            out += self._text(piece)
            self.pending = self.pending[len(piece) :]
            if at < 0:
                break
            m = _MARKER.match(self.pending)
            if m is None:
                if "|>" not in self.pending and len(self.pending) < 32:
                    break  # a marker is arriving
                out += self._text("<|")  # `<|` that opens no marker: text
                self.pending = self.pending[2:]
                continue
            self.pending = self.pending[m.end() :]
            out += self._marker(m.group(0), m.group(1))
        return [p for p in out if p != ""]

    def _text(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.state == "header":
            self.header += text
            return []
        if self.state == "call":
            self.raw += text
            return self.call.feed(text)
        return [text]

    def _marker(self, marker: str, name: str) -> list[Piece]:
        if self.state == "call":
            if name not in _BODY_ENDS:
                self.raw += marker
                return []
            return self._end_call(marker)
        if name in _HEADER_STARTS:
            if self.state != "header":
                self.state, self.header = "header", ""
            self.header += marker
            return []
        if name == "message" and self.state == "header":
            m = _RECIPIENT.search(self.header)
            if m is None:
                self.state = "body"
                return []
            self.state, self.call = "call", JsonCallStream(self, m.group(1))
            self.raw = self.header + marker
            return []
        if self.state == "header":
            self.header += marker  # <|constrain|> and the like
        elif name in _BODY_ENDS:
            self.state = "body"
        return []

    def _end_call(self, end: str) -> list[Piece]:
        pieces, ok = self.call.close()
        self.state, self.call = "body", None
        return pieces if ok else [self.raw + end]

    def finish(self) -> list[Piece]:
        rest, self.pending = self.pending, ""
        out = self._text(rest)
        if self.state == "call":
            out += self._end_call("")
        return [p for p in out if p != ""]
