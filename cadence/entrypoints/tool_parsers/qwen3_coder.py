"""Qwen3-Coder's XML tool calls:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Values are text; each is typed by the tool's JSON schema (a string stays text; numbers,
booleans, objects and arrays are read as JSON, Python's True/False/None too). Streamed, a
call opens at `<function=NAME>` and each parameter goes out as `"key": value` when its
`</parameter>` arrives. A block with no function is given back as text."""

from __future__ import annotations

import json
import re
from typing import Any

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>]+)>(.*?)</parameter>", re.DOTALL)
_FUNCTION_END = re.compile(r"\s*</function>")
_PYTHON_LITERALS = {"True": True, "False": False, "None": None}


class Qwen3CoderToolParser(ToolParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.in_block = False
        self.name: str | None = None  # the open block's function, once seen
        self.args: dict[str, Any] = {}
        self.body = ""  # the open block's text after <function=...>, not yet parsed

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            if not self.in_block:
                text, opened = self.text_until(OPEN)
                out.append(text)
                if not opened:
                    break
                self.in_block, self.raw, self.name, self.args, self.body = True, "", None, {}, ""
                continue
            chunk, closed = self.text_until(CLOSE)
            self.raw += chunk
            out += self._read(chunk)
            if not closed:
                break
            out += self._end_block(CLOSE)
        return [p for p in out if p != ""]

    def _read(self, chunk: str) -> list[Piece]:
        """Parameters completed by `chunk` (streamed out when incremental)."""
        self.body += chunk
        out: list[Piece] = []
        if self.name is None:
            m = _FUNCTION.match(self.body)
            if m is None:
                return []
            self.name, self.body = m.group(1), self.body[m.end() :]
            if self.incremental:
                out.append(self.open_call(self.name, "{"))
        while (m := _PARAMETER.match(self.body)) is not None:
            key, value = m.group(1).strip(), self._value(m.group(1).strip(), m.group(2))
            self.body = self.body[m.end() :]
            if self.incremental:
                sep = ", " if self.args else ""
                entry = json.dumps(key, ensure_ascii=False) + ": "
                out += self.more(sep + entry + json.dumps(value, ensure_ascii=False))
            self.args[key] = value
        return out

    def _value(self, key: str, text: str) -> Any:
        text = text.removeprefix("\n").removesuffix("\n")
        schema = self.parameters.get(self.name or "", {}).get("properties", {}).get(key, {})
        types = schema.get("type", "string") if isinstance(schema, dict) else "string"
        if types == "string" or (isinstance(types, list) and types[:1] == ["string"]):
            return text
        if text.strip() in _PYTHON_LITERALS:
            return _PYTHON_LITERALS[text.strip()]
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def _end_block(self, close: str) -> list[Piece]:
        self.in_block = False
        if self.name is None:
            return [OPEN + self.raw + close]
        if self.incremental:
            return self.more("}")
        return [self.open_call(self.name, json.dumps(self.args, ensure_ascii=False))]

    def finish(self) -> list[Piece]:
        rest, self.pending = self.pending, ""
        if not self.in_block:
            return [rest] if rest else []
        self.raw += rest
        out = self._read(rest)
        return [p for p in out + self._end_block("") if p != ""]
