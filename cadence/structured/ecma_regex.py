"""JSON schema's patterns (ECMA-262 regular expressions) for Python's `regex` package.

`regex` reads most of ECMA-262 as it is, `\\p{L}` and lookaround included. What it does
not: a character above U+FFFF written as a UTF-16 surrogate pair (`\\uD83D\\uDE00`, or the
range `\\uD800\\uDC00-\\uDBFF\\uDFFF` that AWS's schemas use for "any character"): here the
pair becomes the one code point it spells.
"""

from __future__ import annotations

import re

_PAIR = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE)


def _code_point(m: re.Match) -> str:
    high, low = int(m.group(1), 16), int(m.group(2), 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"


def to_python(pattern: str) -> str:
    return _PAIR.sub(_code_point, pattern)


def compile_pattern(pattern: str):
    """The compiled pattern; raises regex.error when it is no regular expression."""
    import regex

    return regex.compile(to_python(pattern))
