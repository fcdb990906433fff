"""The answer a `tool_choice: "required"` grammar forces, whatever the model's own format:
a JSON array of call objects, `[{"name": "f", "arguments": {...}}, ...]`. Each call streams
as it is written; an answer that is not such an array is given back as text."""

from __future__ import annotations

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream


class JsonArrayToolParser(ToolParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = "start"  # start | items (between objects) | call | end | text
        self.call: JsonCallStream | None = None

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            if self.state in ("text", "end"):
                out.append(self.pending if self.state == "text" else "")
                self.raw += self.pending
                self.pending = ""
                break
            if self.state == "call":
                pieces, ok = self.call.read()
                if ok is None:
                    out += pieces
                    break
                out += pieces if ok else self._fail()
                self.state = "items" if ok else "text"
                continue
            head = self.pending.lstrip()
            if self.state == "items":
                head = head.lstrip(",").lstrip()
            if not head:
                break
            self.take(len(self.pending) - len(head))
            if self.state == "start" and head[0] == "[":
                self.take(1)
                self.state = "items"
            elif self.state == "items" and head[0] == "{":
                self.state, self.call = "call", JsonCallStream(self)
            elif self.state == "items" and head[0] == "]":
                self.take(1)
                self.state = "end"
            else:
                out += self._fail()
                self.state = "text"
        return [p for p in out if p != ""]

    def _fail(self) -> list[Piece]:
        return [] if self.num_calls else [self.raw]

    def finish(self) -> list[Piece]:
        if self.state == "call":
            pieces, ok = self.call.close()
            return pieces if ok else self._fail()
        return []
