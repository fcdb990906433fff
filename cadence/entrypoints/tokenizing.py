"""Prompt text to token ids off the event loop, within bounds no client can move.

    lanes = TokenizerLanes(tokenizer, max_model_len)
    ids = await lanes.encode(text, add_special_tokens)    APIError 400 / 408 / 429

What a prompt costs to tokenize grows with its length, which the client picks (bodies are
capped at 32 MiB, and this tokenizer does about 1 MB/s). So, in order:

1. A text longer than max_model_len x the vocabulary's longest token (in characters)
   cannot fit the context whatever it says: 400 at once, nothing tokenized.
2. A short text (SMALL_CHARS) goes to the small lane, a few threads: milliseconds each.
3. A longer one goes to the large lane, one thread, which takes texts while they hold
   fewer than `large_budget_chars` characters in all (else 429: retry later). It first
   counts the text's tokens chunk by chunk (cut at white space), and between chunks it
   checks the clock and the count: a text that is over the context stops as soon as the
   count shows it (400), and one past its deadline stops there (408): no thread goes on
   working for a request that has been answered. Only a text that fits is then tokenized
   whole, for the exact ids (the chunks' cuts may change a few tokens at each cut).

Small requests never queue behind large ones, and large ones cannot pile up.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor

from cadence.entrypoints.errors import APIError

SMALL_CHARS = 1 << 16  # texts up to this many characters take the small lane
CHUNK_CHARS = 1 << 16  # the large lane counts tokens this many characters at a time
CUT_SLACK_TOKENS = 16  # tokens a cut may add (or remove) at each chunk boundary
MIN_LARGE_BUDGET_CHARS = 8 << 20


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of the vocabulary decodes to."""
    tokens = list(tokenizer.get_vocab())
    texts = (tokenizer.convert_tokens_to_string([t]) for t in tokens)
    return max((len(t) for t in texts), default=1) or 1


def chunks(text: str, size: int = CHUNK_CHARS):
    """`text` in pieces of about `size` characters, cut before white space where there
    is some (a newline, else a space) so that words stay whole."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            cut = text.rfind("\n", start + size // 2, end)
            if cut < 0:
                cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


class TokenizerLanes:
    def __init__(
        self,
        tokenizer,
        max_model_len: int,
        timeout_s: float,
        small: ThreadPoolExecutor,
        large_budget_chars: int | None = None,
    ) -> None:
        """`small`: the small lane's threads (shared with the other short CPU work of the
        door: chat templates, grammar parsing)."""
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.timeout_s = timeout_s
        self.max_chars = max_model_len * longest_token_chars(tokenizer)
        self.large_budget_chars = large_budget_chars or max(MIN_LARGE_BUDGET_CHARS, self.max_chars)
        self.small = small
        self.large = ThreadPoolExecutor(1, thread_name_prefix="cadence-prompt-large")
        self.large_chars = 0  # characters the large lane holds (queued or being counted)

    def shutdown(self) -> None:
        self.large.shutdown(wait=False, cancel_futures=True)

    def too_long(self, num_chars: int, param: str = "prompt") -> APIError:
        return APIError(
            f"This model's maximum context length is {self.max_model_len} tokens. However, "
            f"your {param} has more tokens than that ({num_chars} characters).",
            param=param,
            code="context_length_exceeded",
        )

    def check_chars(self, num_chars: int, param: str = "prompt") -> None:
        """400 at once for a text too long to fit whatever it says (point 1)."""
        if num_chars > self.max_chars:
            raise self.too_long(num_chars, param)

    async def run_small(self, what: str, fn, *args):
        """`fn(*args)` on the small lane, within the timeout (408)."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.small, fn, *args), self.timeout_s
            )
        except TimeoutError:
            raise self._timeout(what) from None

    async def encode(self, text: str, add_special_tokens: bool, param: str = "prompt") -> list[int]:
        self.check_chars(len(text), param)
        if len(text) <= SMALL_CHARS:
            return await self.run_small(
                "tokenizing the prompt",
                functools.partial(self.tokenizer.encode, add_special_tokens=add_special_tokens),
                text,
            )
        if self.large_chars + len(text) > self.large_budget_chars:
            raise APIError(
                "the server is busy tokenizing other long prompts; retry shortly",
                429,
                "rate_limit_exceeded",
                param,
                "tokenizer_busy",
                headers={"Retry-After": "1"},
            )
        self.large_chars += len(text)
        deadline = time.monotonic() + self.timeout_s
        loop = asyncio.get_running_loop()
        try:
            work = loop.run_in_executor(
                self.large, self._encode_large, text, add_special_tokens, deadline
            )
            ids = await asyncio.wait_for(work, self.timeout_s + 1.0)
        except TimeoutError:
            raise self._timeout("tokenizing the prompt") from None
        finally:
            self.large_chars -= len(text)
        if ids is None:
            raise self.too_long(len(text), param)
        return ids

    def _encode_large(self, text: str, add_special_tokens: bool, deadline: float):
        """On the large lane: the ids, None if the text is over the context, TimeoutError
        past the deadline (checked between chunks)."""
        t0 = time.monotonic()
        count = 0
        for cuts, piece in enumerate(chunks(text)):  # (cuts: boundaries before this piece)
            if time.monotonic() > deadline:
                raise TimeoutError
            count += len(self.tokenizer.encode(piece, add_special_tokens=False))
            if count - CUT_SLACK_TOKENS * cuts > self.max_model_len:
                return None
        # It fits: tokenize it whole, if a second pass as long as the first ends in time.
        now = time.monotonic()
        if now + (now - t0) > deadline:
            raise TimeoutError
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def _timeout(self, what: str) -> APIError:
        return APIError(
            f"{what} took longer than {self.timeout_s:g} s; send a shorter prompt",
            408,
            "timeout_error",
            code="request_timeout",
        )
