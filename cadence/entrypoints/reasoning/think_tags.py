"""<think> ... </think> reasoning: DeepSeek-R1 and Qwen3 (and the models that copy them).

Qwen3 writes `<think>` itself (or, with `enable_thinking: false`, its template closes an
empty block in the prompt): text is the answer until `<think>` opens, thinking until
`</think>`, the answer after. DeepSeek-R1's template ends the prompt inside `<think>`: text
is thinking from the start (a `<think>` the model writes anyway is dropped) until
`</think>`; with no `</think>` at all it was thinking throughout.
"""

from __future__ import annotations

from cadence.entrypoints.reasoning.base import ReasoningParser, partial_suffix

OPEN, CLOSE = "<think>", "</think>"


class ThinkTagParser(ReasoningParser):
    start_marker, end_marker = OPEN, CLOSE

    def __init__(self) -> None:
        self.state = "thinking" if self.starts_thinking else "before"
        self.pending = ""  # held back: a possible tag prefix
        self.at_start = True  # nothing emitted yet (a leading <think> may still come)
        self.after_close = False  # just past </think>: its blank lines are dropped

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        thinking, answer = "", ""
        while self.pending:
            if self.at_start:
                stripped = self.pending.lstrip()
                if stripped.startswith(OPEN):
                    self.pending = stripped[len(OPEN) :]
                    self.state, self.at_start = "thinking", False
                    continue
                if OPEN.startswith(stripped):
                    break  # `<thi` (or only spaces): wait for more
                self.at_start = False
                if self.state == "before":
                    self.state = "after"
                continue
            if self.state == "thinking":
                end = self.pending.find(CLOSE)
                if end >= 0:
                    thinking += self.pending[:end]
                    self.pending = self.pending[end + len(CLOSE) :]
                    self.state, self.after_close = "after", True
                    continue
                keep = partial_suffix(self.pending, CLOSE)
                thinking += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
                break
            if self.after_close:
                self.pending = self.pending.lstrip("\n")
                if not self.pending:
                    break
                self.after_close = False
            answer += self.pending
            self.pending = ""
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.state == "thinking":
            return rest, ""
        return "", rest.lstrip("\n") if self.after_close else rest


class Qwen3ReasoningParser(ThinkTagParser):
    starts_thinking = False


class DeepSeekR1ReasoningParser(ThinkTagParser):
    starts_thinking = True
