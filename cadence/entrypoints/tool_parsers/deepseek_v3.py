"""DeepSeek-V3 / R1 / V3.1 tool calls, between special tokens:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>                                  V3, R1
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>                                                        V3.1

Text before the calls is content. A section that does not parse is given back as text."""

from __future__ import annotations

import re

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3_NAME = re.compile(r"([^\s`]+)\s*```(?:json)?\s*$")  # NAME\n```json\n before the `{`


class DeepSeekV3ToolParser(ToolParser):
    needs_special_tokens = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # text | calls (between calls) | head (to <｜tool▁sep｜>) | name (to the `{`) | call
        # (the arguments) | tail (to <｜tool▁call▁end｜>)
        self.state = "text"
        self.head = ""
        self.call: JsonCallStream | None = None

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            state = self.state
            if state == "text":
                text, found = self.text_until(CALLS_BEGIN)
                out.append(text)
                if not found:
                    break
                self.state, self.raw = "calls", CALLS_BEGIN
            elif state == "calls":
                head = self.pending.lstrip()
                for marker, next_state in ((CALL_BEGIN, "head"), (CALLS_END, "text")):
                    if head.startswith(marker):
                        self.take(len(self.pending) - len(head) + len(marker))
                        self.state = next_state
                        break
                else:
                    if not head or any(m.startswith(head) for m in (CALL_BEGIN, CALLS_END)):
                        break  # a marker is arriving
                    out += self._fail()
            elif state in ("head", "name", "tail"):
                marker = {"head": SEP, "name": "{", "tail": CALL_END}[state]
                at = self.pending.find(marker)
                if at < 0:
                    break
                piece = self.pending[:at]
                self.take(at + (0 if marker == "{" else len(marker)))
                if state == "head":
                    self.head, self.state = piece.strip(), "name"
                elif state == "tail":
                    self.state = "calls"
                else:
                    name = self._name(piece)
                    if name is None:
                        out += self._fail()
                        continue
                    self.state, self.call = "call", JsonCallStream(self, name)
            else:
                pieces, ok = self.call.read()
                out += pieces
                if ok is None:
                    break
                if not ok:
                    out += self._fail()
                    continue
                self.state = "tail"
        return [p for p in out if p != ""]

    def _name(self, before_args: str) -> str | None:
        """The call's name: V3.1 names it before <｜tool▁sep｜>, V3 after it."""
        if not before_args.strip():
            return self.head or None
        m = _V3_NAME.match(before_args.strip())
        return m.group(1) if m else None

    def _fail(self) -> list[Piece]:
        self.state, self.call = "text", None
        text, self.raw = self.raw, ""
        return [text]

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.state == "call":
            pieces, ok = self.call.close()
            out += pieces if ok else self._fail()
        elif self.state in ("head", "name"):
            self.take(len(self.pending))
            out += self._fail()
        if self.state == "text":
            out.append(self.pending)
        self.pending = ""
        return [p for p in out if p != ""]
