"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the answer is one or more call objects
`{"name": "f", "parameters": {...}}` separated by `;`, at its start or after
`<|python_tag|>`. An answer that does not open with a call is text (`<|python_tag|>` later
in it still starts calls); an object that is not a call, and all after it, is text."""

from __future__ import annotations

import json

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    needs_special_tokens = True  # <|python_tag|> is one
    call_separator = "; "

    @classmethod
    def call_text(cls, name: str) -> tuple[str, str]:
        return f'{{"name": {json.dumps(name)}, "parameters": ', "}"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = "start"  # start | text | calls (between objects) | call (in one)
        self.call: JsonCallStream | None = None

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            if self.state == "start":
                head = self.pending.lstrip()
                if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
                    break  # undecided yet
                if head.startswith(PYTHON_TAG):
                    self.pending, self.state = head[len(PYTHON_TAG) :], "calls"
                else:
                    self.state = "calls" if head.startswith("{") else "text"
                continue
            if self.state == "text":
                text, found = self.text_until(PYTHON_TAG)
                out.append(text)
                if not found:
                    break
                self.state = "calls"
                continue
            if self.state == "calls":
                head = self.pending.lstrip().lstrip(";").lstrip()
                if not head:
                    break  # separators only, so far
                if not head.startswith("{"):
                    self.pending, self.state = head, "text"
                    continue
                self.pending, self.state = head, "call"
                self.call, self.raw = JsonCallStream(self), ""
                continue
            pieces, ok = self.call.read()
            out += pieces
            if ok is None:
                break
            out += self._end_call(ok)
        return [p for p in out if p != ""]

    def _end_call(self, ok: bool) -> list[Piece]:
        self.call = None
        if ok:
            self.state = "calls"
            return []
        self.state = "text"  # not a call: it and the rest are the answer's text
        return [self.raw]

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.state == "call":
            pieces, ok = self.call.close()
            out += pieces + self._end_call(ok)
        rest, self.pending = self.pending, ""
        if self.state == "text" or (self.state == "start" and rest.strip()):
            out.append(rest)
        return [p for p in out if p != ""]
