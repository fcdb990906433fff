"""Run-time checks for what a grammar cannot say: each value against the user's schema as
it completes, and the whole output at its end.

    checks = SchemaChecks(schema)                       once per schema (cached with it)
    matcher = CheckedMatcher(inner, checks, vocab)      per request, in place of the
                                                        grammar's matcher (same methods)

The grammar (built from structured/schema_relax.py's wider schema) decides which tokens may
come next; among those, a token that would complete a value is tried on a copy of the
output's JSON (json_tracker) and left out of the mask when the value breaks the schema: an
array item that repeats an earlier one under uniqueItems, a string its pattern rejects, an
object that misses a dependency, a whole output that fails `not` or `if`/`then`. The model
then writes something else there (a longer string, another item).

A value is checked against every subschema that may apply at its place (properties,
items, additionalProperties, through anyOf / oneOf / allOf); it passes when one of them
accepts it, so a value is never refused that some valid output could hold. The whole
output is checked exactly. When the grammar leaves no token that passes (a dead end), the
mask stays the grammar's and the request is marked `violated`: the engine does not finish
it as a success (see the gate).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cadence.structured.ecma_regex import compile_pattern
from cadence.structured.grammar import pattern_readable
from cadence.structured.json_tracker import JsonTracker, Path
from cadence.structured.schema_refusals import unenforced_here
from cadence.structured.schema_rules import resolve_ref, subschemas_here

_COMBINATORS = ("anyOf", "oneOf", "allOf")
_MAX_CACHED = 4096  # places whose subschemas are remembered, per schema
_MAX_TRIED = 2048
_LOOKAHEAD_MAX = 64  # ways on, at most, for each to be tried with the text forced after it  # tokens tried per mask row at most (the rest keep the grammar's verdict)


class VocabText:
    """Each token's text, and which tokens can complete a value: a quote ends a string, a
    closing bracket an object or array, two quotes a whole string."""

    def __init__(self, decoded: list[bytes], vocab_size: int) -> None:
        self.text = [b.decode("utf-8", "replace") for b in decoded[:vocab_size]]
        self.text += [""] * (vocab_size - len(self.text))
        self.quote = np.array(['"' in t for t in self.text])
        self.bracket = np.array(["]" in t or "}" in t for t in self.text])
        self.two_quotes = np.array([t.count('"') >= 2 for t in self.text])
        self.everything = np.ones(vocab_size, dtype=bool)
        self.quote_id = self.text.index('"') if '"' in self.text else None  # `"` alone


def _pattern(validator, pattern: str, instance: Any, schema: dict):
    """`pattern` as JSON schema reads it (ECMA-262: `\\p{L}`, lookaround), which the
    `regex` package understands and `re` does not wholly."""
    import jsonschema
    import regex

    if not validator.is_type(instance, "string"):
        return
    try:
        found = compile_pattern(pattern).search(instance)
    except regex.error:
        return  # (a pattern no engine here reads: not judged)
    if found is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _no_retrieval(uri: str):
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)


class SchemaChecks:
    """Validators for one schema: the whole, and the subschemas at a value's place."""

    def __init__(self, schema: Any) -> None:
        import jsonschema
        import referencing

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls = jsonschema.validators.extend(cls, {"pattern": _pattern})
        self.root = schema
        # A client's schema never makes the server fetch a URL: `$ref`s outside it are not
        # retrieved (the check then cannot judge the value, and lets it be).
        registry = referencing.Registry(retrieve=_no_retrieval)
        self.validator = cls(schema, format_checker=cls.FORMAT_CHECKER, registry=registry)
        self._at: dict[Path, list | None] = {}  # place -> candidate validators (None: any)
        self._exact: dict[Path, bool] = {}  # place -> the grammar enforces it whole
        self._unique_at: dict[Path, bool] = {}  # array path -> items must be unique

    def valid(self, path: Path, value: Any, earlier: list | None = None) -> bool:
        """`value`, completed at `path` (an array item after `earlier` items), breaks none
        of what may apply there (a repeat under uniqueItems is caught as the item ends).
        A schema the validator cannot follow (a reference that loops forever) is not
        judged: the check never takes the engine down."""
        try:
            return self._valid(path, value, earlier)
        except Exception:  # RecursionError, a format checker's own bug, ...
            return True

    def _valid(self, path: Path, value: Any, earlier: list | None) -> bool:
        if earlier and self._unique(path[:-1]) and any(_same(value, e) for e in earlier):
            return False
        if not path:
            return self.validator.is_valid(value)
        if self.exact(path):
            return True  # (the grammar already held the value to all of it)
        if path not in self._at:
            if len(self._at) > _MAX_CACHED:
                self._at.clear()
            self._at[path] = self._candidates(path)
        candidates = self._at[path]
        if candidates is None:
            return True  # some schema there allows anything
        return any(v.is_valid(value) for v in candidates)

    def needs_check(self, path: Path) -> bool:
        """A value completing at `path` could break the schema though the grammar allowed
        it: its place is not exact, or it is an item of an array that wants unique ones."""
        if path and isinstance(path[-1], int) and self._unique(path[:-1]):
            return True
        return not path or not self.exact(path)

    def exact(self, path: Path) -> bool:
        """Every schema that may apply at `path` is one the grammar enforces whole (nothing
        in it, or in what it references, was relaxed)."""
        if path not in self._exact:
            if len(self._exact) > _MAX_CACHED:
                self._exact.clear()
            level = self._schemas(path)
            self._exact[path] = level is None or all(_exact(self.root, s) for s in level)
        return self._exact[path]

    def _unique(self, array_path: Path) -> bool:
        """Every schema that may apply to the array at `array_path` wants unique items."""
        if array_path not in self._unique_at:
            if len(self._unique_at) > _MAX_CACHED:
                self._unique_at.clear()
            level = self._schemas(array_path)
            self._unique_at[array_path] = bool(level) and all(
                any(p.get("uniqueItems") is True for p in _expand(self.root, s)) for s in level
            )
        return self._unique_at[array_path]

    def _candidates(self, path: Path) -> list | None:
        level = self._schemas(path)
        return None if level is None else [self.validator.evolve(schema=s) for s in level]

    def _schemas(self, path: Path) -> list | None:
        level = [self.root]
        for step in path:
            nxt: list = []
            for s in level:
                for part in _expand(self.root, s):
                    sub = _child(part, step)
                    if sub is True or sub == {}:
                        return None
                    if sub is not None:
                        nxt.append(sub)
            if not nxt:
                return None
            level = nxt
        return level


def _exact(root: Any, schema: Any) -> bool:
    """Nothing in `schema` (references followed) is beyond the grammar: no keyword
    schema_refusals names, no pattern xgrammar misreads, no oneOf (whose branches may
    overlap; judged conservatively), no `false`."""
    stack, seen = [schema], set()
    while stack:
        s = stack.pop()
        if s is False:
            return False
        if isinstance(s, dict) and isinstance(s.get("$ref"), str):
            target = resolve_ref(root, s)
            if target is None:
                return False
            stack.append(target)
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        if unenforced_here(s, "") or "oneOf" in s:
            return False
        patterns = [s["pattern"]] if isinstance(s.get("pattern"), str) else []
        patterns += (
            list(s["patternProperties"]) if isinstance(s.get("patternProperties"), dict) else []
        )
        if not all(pattern_readable(p) for p in patterns):
            return False
        stack += [sub for _, sub in subschemas_here(s)]
    return True


def _same(a: Any, b: Any) -> bool:
    """JSON equality, as uniqueItems means it (1 == 1.0; true is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b and (isinstance(a, int | float) == isinstance(b, int | float))


def _expand(root: Any, s: Any) -> list[dict]:
    """`s` and the branches of its combinators, references followed."""
    out: list[dict] = []
    stack, seen = [s], set()
    while stack:  # (a recursive schema leads back to itself: each schema once)
        s = stack.pop()
        s = resolve_ref(root, s) if isinstance(s, dict) and "$ref" in s else s
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        out.append(s)
        for key in _COMBINATORS:
            branches = s.get(key)
            stack += reversed(branches) if isinstance(branches, list) else []
    return out


def _child(s: dict, step: str | int) -> Any:
    """The subschema `s` gives a member (a key or an index); True when it allows anything,
    None when it says nothing of this member (another branch may)."""
    if isinstance(step, int):
        prefix = s.get("prefixItems", s.get("items") if isinstance(s.get("items"), list) else None)
        if isinstance(prefix, list) and step < len(prefix):
            return prefix[step]
        items = s.get("items") if not isinstance(s.get("items"), list) else s.get("additionalItems")
        return items if isinstance(items, dict | bool) else None
    props = s.get("properties")
    if isinstance(props, dict) and step in props:
        return props[step]
    if isinstance(s.get("patternProperties"), dict):
        return True  # (a name pattern may apply: not judged here)
    extra = s.get("additionalProperties")
    if extra is None and ("properties" in s or s.get("type") == "object"):
        return True
    return extra if isinstance(extra, dict | bool) and extra is not False else None


class CheckedMatcher:
    def __init__(self, inner, checks: SchemaChecks, vocab: VocabText, stop_tokens) -> None:
        self.inner = inner  # the grammar's matcher (xgrammar)
        self.checks = checks
        self.vocab = vocab
        self.stop_tokens = frozenset(stop_tokens)
        self.tracker = JsonTracker()
        self.texts: list[str] = []  # accepted tokens' text, for rollback
        self.violated: str | None = None  # why, once a dead end let a bad value through
        self._violated_at = 0  # tokens accepted when it was set (a rollback may undo it)

    def accept_token(self, token: int) -> bool:
        if not self.inner.accept_token(token):
            return False
        text = "" if token in self.stop_tokens else self._text(token)
        self.texts.append(text)
        events = self.tracker.feed(text) if text else self.tracker.end()
        for path, value, earlier in events:
            if self.violated is None and not self.checks.valid(path, value, earlier):
                self.violated = f"the value at {_pointer(path)} breaks the schema"
                self._violated_at = len(self.texts)
        return True

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        self.inner.rollback(n)
        del self.texts[-n:]
        if self.violated is not None and self._violated_at > len(self.texts):
            self.violated = None  # (a speculative draft broke it, and is gone)
        self.tracker = JsonTracker()
        self.tracker.feed("".join(self.texts))

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def find_jump_forward_tokens(self) -> list[int]:
        return []  # (forced text could complete a value unchecked: sampled one by one)

    def fill_next_token_bitmask(self, mask: torch.Tensor, row: int) -> None:
        self.inner.fill_next_token_bitmask(mask, row)
        allowed = _allowed(mask[row], len(self.vocab.text))
        n_allowed = int(np.count_nonzero(allowed))
        # Few ways on (an enum, a const, a closing bracket): each is tried with the text the
        # grammar forces after it, so a value is judged where the choice is still open
        # ("blue" of an enum, before its forced closing quote). Many: only the tokens that
        # can end a value themselves.
        lookahead = n_allowed <= _LOOKAHEAD_MAX
        tried = allowed if lookahead else allowed & self._may_complete()
        # Closing the string may close its object or array too, where the grammar forces
        # that ('"' then a forced `}`: the item's last property): then every token that
        # closes the string is tried with the forced text after it.
        after_quote = "" if lookahead else self._forced_after_quote(allowed)
        if "]" in after_quote or "}" in after_quote:
            tried = allowed & self.vocab.quote
        tried = tried.copy()
        for t in self.stop_tokens:
            if t < len(tried):
                tried[t] = bool(allowed[t]) and self.tracker.in_bare_scalar
        ids = np.flatnonzero(tried).tolist()
        if not ids or len(ids) > _MAX_TRIED:
            return
        banned = [t for t in ids if not self._passes(t, lookahead, after_quote)]
        if len(banned) == n_allowed:
            return  # a dead end: every way on breaks the schema (see `violated`)
        for t in banned:
            _ban(mask, row, t)

    def _may_complete(self) -> np.ndarray:
        """The tokens that may complete a value that needs checking, from here."""
        vocab, tracker = self.vocab, self.tracker
        if tracker.in_bare_scalar:  # a number or literal: any other character ends it
            return vocab.everything
        if tracker.in_string:
            is_value = not (tracker.expect_key and tracker.stack)
            if is_value and self.checks.needs_check(tracker.path()):
                return vocab.quote
            return vocab.quote & vocab.bracket  # (its container may be the one to check)
        return vocab.bracket | vocab.two_quotes

    def _forced_after_quote(self, allowed: np.ndarray) -> str:
        """In a string: the text the grammar forces once it closes ("" elsewhere)."""
        quote = self.vocab.quote_id
        if not self.tracker.in_string or quote is None or not allowed[quote]:
            return ""
        if not self.inner.accept_token(quote):
            return ""
        forced = self.inner.find_jump_forward_string()
        self.inner.rollback(1)
        return forced

    def _passes(self, token: int, lookahead: bool, after_quote: str = "") -> bool:
        trial = self.tracker.clone()
        if token in self.stop_tokens:
            events = trial.end()
        else:
            text = self._text(token)
            if lookahead and self.inner.accept_token(token):
                text += self.inner.find_jump_forward_string()
                self.inner.rollback(1)
            elif after_quote and _closes_with_its_last_char(text):
                text += after_quote
            events = trial.feed(text)
        return all(self.checks.valid(path, value, earlier) for path, value, earlier in events)

    def _text(self, token: int) -> str:
        return self.vocab.text[token] if token < len(self.vocab.text) else ""


def _closes_with_its_last_char(text: str) -> bool:
    """In a string, `text` ends it with its last character (one quote, unescaped, last)."""
    return text.endswith('"') and text.count('"') == 1 and not text.endswith('\\"')


def _allowed(words: torch.Tensor, vocab_size: int) -> np.ndarray:
    """The mask row (int32 words, token i at bit i % 32 of word i // 32) as one bool per
    token."""
    bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def _ban(mask: torch.Tensor, row: int, token: int) -> None:
    bit = 1 << (token & 31)
    if bit >= 2**31:
        bit -= 2**32
    word = token >> 5
    mask[row, word] = int(mask[row, word]) & ~bit


def _pointer(path: Path) -> str:
    return "#" + "".join(f"/{p}" for p in path)
