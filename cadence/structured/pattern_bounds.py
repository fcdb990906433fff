"""A regex and minLength / maxLength as one regex (xgrammar applies a pattern and ignores
the length bounds beside it): the pattern's open repetitions get bounds.
"""

from __future__ import annotations

import re
from typing import Any


def _pattern_width(pattern: str) -> tuple[int, int] | None:
    """(fewest, most) characters a full match of `pattern` has; None if Python's regex
    parser cannot read it (JSON schema's ECMA-262 dialect is close to Python's)."""
    try:
        import re._parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover - older Pythons
        import sre_parse  # type: ignore[no-redef]
    try:
        lo, hi = sre_parse.parse(pattern).getwidth()
    except Exception:  # noqa: BLE001 - any pattern Python cannot parse
        return None
    return lo, hi


def _open_quantifiers(pattern: str) -> list[tuple[int, int, int]]:
    """(start, end, lower bound) of each `*`, `+` and `{m,}` outside character classes."""
    found = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern[i + 1 : i + 2] == "^" else 1
            i += 1 if pattern[i : i + 1] == "]" else 0  # a leading ] is a literal
            continue
        elif c in "*+":
            found.append((i, i + 1, 0 if c == "*" else 1))
        elif c == "{" and (m := re.match(r"\{(\d+),\}", pattern[i:])):
            found.append((i, i + m.end(), int(m[1])))
            i += m.end()
            continue
        i += 1
    return found


# Each open repetition is capped at this many (or the length bound, if less): a tighter
# output, but a bounded repetition costs compile time (0.5 s for {1,2048}, measured).
MAX_REPEAT_CAP = 256


def bounded_pattern(pattern: str, min_len: Any, max_len: Any) -> str | None:
    """A pattern whose every full match also has minLength <= length <= maxLength, made
    by bounding the pattern's open repetitions (`+` -> `{1,K}`); None if none is found.
    xgrammar matches a pattern against the whole string (a subset of JSON schema's
    search), and applies the pattern alone: the bounds must live in the pattern."""
    if not all(v is None or (isinstance(v, int) and v >= 0) for v in (min_len, max_len)):
        return None
    lo_need, hi_need = min_len or 0, max_len
    width = _pattern_width(pattern)
    if width is None:
        return None
    if width[0] >= lo_need and (hi_need is None or width[1] <= hi_need):
        return pattern  # the pattern already implies the bounds
    quantifiers = _open_quantifiers(pattern)
    if not quantifiers:
        return None

    def rewrite(low: int, cap: int) -> str:
        out, last = [], 0
        for start, end, q_low in quantifiers:
            least = max(q_low, low)
            out += [pattern[last:start], f"{{{least},{max(least, cap)}}}"]
            last = end
        return "".join(out) + pattern[last:]

    def width_of(low: int, cap: int) -> tuple[int, int]:
        w = _pattern_width(rewrite(low, cap))
        return w if w is not None else (0, 1 << 62)

    top = max(MAX_REPEAT_CAP, lo_need)
    top = top if hi_need is None else min(top, hi_need)
    cap = _last_true(0, top, lambda k: hi_need is None or width_of(0, k)[1] <= hi_need)
    if cap is None:
        return None
    low = _first_true(0, cap, lambda k: width_of(k, cap)[0] >= lo_need)
    if low is None:
        return None
    return rewrite(low, cap)


def _last_true(a: int, b: int, ok) -> int | None:
    """The largest k in [a, b] with ok(k), for ok true up to some point, then false."""
    if not ok(a):
        return None
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if ok(mid) else (a, mid - 1)
    return a


def _first_true(a: int, b: int, ok) -> int | None:
    """The smallest k in [a, b] with ok(k), for ok false up to some point, then true."""
    if not ok(b):
        return None
    while a < b:
        mid = (a + b) // 2
        a, b = (a, mid) if ok(mid) else (mid + 1, b)
    return a
