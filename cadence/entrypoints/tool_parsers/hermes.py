"""Hermes / Qwen 2.5 / Qwen3: `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`,
any number of blocks, text between them. A block that is not a call stays text; an
unclosed last block (output cut short) is a call when what came parses."""

from __future__ import annotations

import json

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    @classmethod
    def call_text(cls, name: str) -> tuple[str, str]:
        return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": ', f"}}\n{CLOSE}"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block: JsonCallStream | None = None  # inside <tool_call>

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            if self.block is None:
                text, opened = self.text_until(OPEN)
                out.append(text)
                if not opened:
                    break
                self.block, self.raw = JsonCallStream(self), ""
                continue
            body, closed = self.text_until(CLOSE)
            out += self.block.feed(body)
            self.raw += body
            if not closed:
                break
            out += self._end_block(CLOSE)
        return [p for p in out if p != ""]

    def _end_block(self, close: str) -> list[Piece]:
        pieces, ok = self.block.close()  # (text after the call's object is dropped)
        if not ok:
            pieces = [OPEN + self.raw + close]
        self.block = None
        return pieces

    def finish(self) -> list[Piece]:
        rest, self.pending = self.pending, ""
        if self.block is None:
            return [rest] if rest else []
        out = self.block.feed(rest)
        self.raw += rest
        return out + self._end_block("")
