"""Token ids in, text out, a step at a time: only whole characters are emitted.

    push(new_ids) -> str   the text the new tokens complete ("" while a character is cut)
    flush() -> str         at the end: what is still pending, as a whole decode shows it
                           (a character cut off by max_tokens reads as U+FFFD)

Two ways, one contract:

- `StreamDetokenizer` (fast tokenizers, the usual case): the `tokenizers` library's
  DecodeStream decodes each new token once, in Rust, against a window of the tokens before
  it; it is primed with the prompt's last tokens so a word-initial space survives.
- `IncrementalDetokenizer` (a tokenizer without a Rust backend): decodes a window of ids
  twice per step (before and after) in Python and keeps the difference.

A step may bring several tokens (speculation, forced tokens): they are stepped one by one,
so the text of every character they complete goes out, and only a cut one waits.
"""

from __future__ import annotations

from typing import Protocol

# Prompt tokens decoded ahead of the output, so a word-initial space survives the cut.
_PREFIX_TOKENS = 5


class Detokenizer(Protocol):
    def push(self, new_ids: list[int]) -> str: ...
    def flush(self) -> str: ...


def make_detokenizer(
    tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool
) -> Detokenizer:
    """The detokenizer for one sample: DecodeStream where the tokenizer has a Rust
    backend, else the window decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return StreamDetokenizer(tokenizer, backend, prompt_token_ids, skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)


class StreamDetokenizer:
    def __init__(
        self, tokenizer, backend, prompt_token_ids: list[int], skip_special_tokens: bool
    ) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer  # (flush decodes the pending ids with it)
        self.backend = backend
        self.skip_special = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.pending: list[int] = []  # ids stepped since the last text (a cut character)
        self.context = list(prompt_token_ids[-_PREFIX_TOKENS:])
        for token in self.context:  # prime: the output's first word keeps its space
            self.stream.step(backend, token)

    def push(self, new_ids: list[int]) -> str:
        pieces = []
        for token in new_ids:
            self.pending.append(token)
            text = self.stream.step(self.backend, token)
            if text is not None:
                pieces.append(text)
                self.context = self.context[-_PREFIX_TOKENS:] + self.pending
                self.pending = []
        return "".join(pieces)

    def flush(self) -> str:
        if not self.pending:
            return ""
        # The pending ids' text as a whole decode reads it: decoded after the context they
        # follow, the context's own text cut off.
        before = self.tokenizer.decode(self.context, skip_special_tokens=self.skip_special)
        after = self.tokenizer.decode(
            self.context + self.pending, skip_special_tokens=self.skip_special
        )
        self.pending = []
        return after[len(before) :] if after.startswith(before) else after


class IncrementalDetokenizer:
    """Tokens up to `read_offset` have been emitted as text; the ones after it are pending
    (they end inside a character: a byte-level tokenizer spells an emoji in several)."""

    # A UTF-8 character is at most 4 bytes: the most byte tokens that can end inside one.
    _MAX_PARTIAL_TOKENS = 4

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.tokens = list(prompt_token_ids[-_PREFIX_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def _decode(self, end: int) -> str:
        ids = self.tokens[self.prefix_offset : end]
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def push(self, new_ids: list[int]) -> str:
        """The longest run of the new tokens that ends on a whole character is emitted,
        the rest waits."""
        if self.tokenizer is None:
            return ""
        self.tokens.extend(new_ids)
        lowest = max(self.read_offset, len(self.tokens) - self._MAX_PARTIAL_TOKENS)
        return self._read(range(len(self.tokens), lowest, -1), whole_chars=True)

    def flush(self) -> str:
        if self.tokenizer is None or self.read_offset == len(self.tokens):
            return ""
        return self._read([len(self.tokens)], whole_chars=False)

    def _read(self, ends, whole_chars: bool) -> str:
        """Emit the text up to the first of `ends` (token offsets) that adds some, and with
        `whole_chars` ends on a whole character; "" (nothing read) if none does."""
        before = self._decode(self.read_offset)
        for end in ends:
            after = self._decode(end)
            if len(after) > len(before) and not (whole_chars and after.endswith("\ufffd")):
                self.prefix_offset, self.read_offset = self.read_offset, end
                return after[len(before) :]
        return ""
