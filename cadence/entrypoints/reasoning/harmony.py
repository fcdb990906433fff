"""GPT-OSS's harmony format: `<|channel|>analysis<|message|>THINKING<|end|>` then
`<|start|>assistant<|channel|>final<|message|>ANSWER<|return|>`. The markers are special
tokens, so the sample's text keeps them (`needs_special_tokens`). A message's header (up
to `<|message|>`) names its channel: text in `analysis` is thinking, in any other channel
(`final`, a `commentary` preamble) the answer; markers and headers are neither. Text with
no header at all is the answer. A message to a recipient (`to=functions.f`: a tool call)
goes to the answer whole, header and markers kept, for the tool-call parser.
"""

from __future__ import annotations

import re

from cadence.entrypoints.reasoning.base import ReasoningParser

_MARKER = re.compile(r"<\|(\w+)\|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyReasoningParser(ReasoningParser):
    needs_special_tokens = True
    end_marker = "<|channel|>final<|message|>"  # the answer's channel opens
    starts_thinking = True  # (a model that answers at once writes the marker first)

    def __init__(self) -> None:
        self.state = "body"  # header (to <|message|>) | body | between (after <|end|>)
        self.channel = "final"
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        thinking, answer = "", ""
        while self.pending:
            if self.state == "header":
                end = self.pending.find("<|message|>")
                if end < 0:
                    break
                header = self.pending[:end]
                m = _CHANNEL.search(header)
                self.channel = m.group(1) if m else "final"
                if "to=" in header:  # a call: kept whole for the tool-call parser
                    self.channel = "call"
                    answer += "<|start|>" + header + "<|message|>"
                self.pending = self.pending[end + len("<|message|>") :]
                self.state = "body"
                continue
            at = self.pending.find("<|")
            if at < 0:
                keep = 1 if self.pending.endswith("<") else 0
                piece = self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
            else:
                piece, self.pending = self.pending[:at], self.pending[at:]
            if self.state == "body":
                if self.channel == "analysis":
                    thinking += piece
                else:
                    answer += piece
            if at < 0:
                break
            m = _MARKER.match(self.pending)
            if m is None:
                if "|>" in self.pending:  # `<|` that is no marker: text
                    self.pending = self.pending[2:]
                    if self.state == "body":
                        thinking, answer = _add(thinking, answer, "<|", self.channel)
                    continue
                break  # the marker is still arriving
            name = m.group(1)
            if name == "channel":  # (kept: the header's parse reads it)
                self.state = "header"
                continue
            self.pending = self.pending[m.end() :]
            if self.channel == "call" and self.state == "body":
                answer += m.group(0)
            if name == "start":
                self.state = "header"
            elif name in ("end", "return", "call"):
                self.state = "between"
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.state != "body":
            return "", ""
        return _add("", "", rest, self.channel)


def _add(thinking: str, answer: str, text: str, channel: str) -> tuple[str, str]:
    return (thinking + text, answer) if channel == "analysis" else (thinking, answer + text)
