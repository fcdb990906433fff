"""Mistral's tool calls, after the `[TOOL_CALLS]` control token, in either of its forms:

    [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]      tokenizers up to v7
    [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}          v11 and later
    ([TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{...} too)

Text before the first call is content. Call ids are 9 letters or digits, the only form
Mistral's templates accept back. A section that does not parse is given back as text."""

from __future__ import annotations

from cadence.entrypoints.tool_parsers.base import Piece, ToolParser, mistral_call_id
from cadence.entrypoints.tool_parsers.json_calls import JsonCallStream

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralToolParser(ToolParser):
    needs_special_tokens = True  # its markers are control tokens
    make_id = staticmethod(mistral_call_id)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # text | form (after [TOOL_CALLS], undecided) | array (between objects) | name (v11,
        # to [ARGS]) | call (in an object)
        self.state = "text"
        self.call: JsonCallStream | None = None
        self.in_array = False

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        out: list[Piece] = []
        while self.pending:
            state = self.state
            if state == "text":
                text, found = self.text_until(TOOL_CALLS)
                out.append(text)
                if not found:
                    break
                self.state, self.raw = "form", TOOL_CALLS
            elif state in ("form", "array"):
                head = self.pending.lstrip()
                if state == "array":
                    head = head.lstrip(",").lstrip()
                if not head:
                    break
                self.take(len(self.pending) - len(head))
                if state == "form" and head[0] == "[":
                    self.take(1)
                    self.state, self.in_array = "array", True
                elif head[0] == "{":
                    self.state, self.call = "call", JsonCallStream(self)
                elif state == "array" and head[0] == "]":
                    self.take(1)
                    self.state, self.in_array = "text", False
                elif state == "form":
                    self.state = "name"
                else:
                    out += self._fail()
            elif state == "name":
                at = self.pending.find(ARGS)
                if at < 0:
                    if _not_a_name(self.pending):
                        out += self._fail()
                        continue
                    break  # (a name is short: held until [ARGS])
                name = self.pending[:at].split(CALL_ID)[0].strip()
                self.take(at + len(ARGS))
                if not name:
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
                self.call = None
                self.state = "array" if self.in_array else "text"
        return [p for p in out if p != ""]

    def _fail(self) -> list[Piece]:
        """The section is not calls after all: it and the rest are text."""
        self.state, self.call, self.in_array = "text", None, False
        text, self.raw = self.raw, ""
        return [text]

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self.state == "call":
            pieces, ok = self.call.close()
            out += pieces if ok else self._fail()
        elif self.state in ("form", "name"):
            self.raw += self.pending
            self.pending = ""
            out += self._fail()
        rest, self.pending = self.pending, ""
        out.append(rest)
        return [p for p in out if p != ""]


def _not_a_name(text: str) -> bool:
    """Text after [TOOL_CALLS] that can no longer be `name[ARGS]` (or `name[CALL_ID]id`)."""
    name = text.split(CALL_ID)[0].strip()
    return len(text) > 256 or any(ch.isspace() for ch in name)
