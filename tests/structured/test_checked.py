"""Run-time schema checks (structured/checked.py) over a one-character-per-token
vocabulary: for each keyword no grammar expresses, the checked matcher never lets the
violating text through (a character is banned, or the request is marked violated at a
dead end) and lets the valid text through untouched."""

from __future__ import annotations

import string

import jsonschema
import pytest
from keyword_probes import PROBES
from test_keyword_enforcement import REFUSED

from cadence.sampling_params import StructuredOutputsParams as S
from cadence.structured.checked import CheckedMatcher, SchemaChecks, VocabText
from cadence.structured.grammar import runtime_schema, to_grammar

CHARS = list(string.printable)
EOS = len(CHARS)
VOCAB = [*CHARS, "</s>"]
# Refused in strict mode, checked at run time otherwise; these three stay refused (or
# unknown): a schema accepting nothing, and references no one here can read.
RUNTIME = sorted(set(REFUSED) - {"boolean-schema-false", "ref-external", "ref-anchor"})


@pytest.fixture(scope="module")
def compiler():
    import xgrammar as xgr

    info = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return xgr.GrammarCompiler(info, cache_enabled=False)


def checked_matcher(compiler, schema) -> CheckedMatcher:
    import xgrammar as xgr

    params = S(json=schema)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(to_grammar(params)))
    vocab = VocabText([v.encode() for v in VOCAB], len(VOCAB))
    return CheckedMatcher(matcher, SchemaChecks(runtime_schema(params)), vocab, [EOS])


def walk(matcher: CheckedMatcher, text: str) -> str:
    """'banned at N' when the mask refuses a character, 'violated' when the text got
    through a dead end, else 'accepted'."""
    import xgrammar as xgr

    mask = xgr.allocate_token_bitmask(1, len(VOCAB))
    for i, token in enumerate([CHARS.index(c) for c in text] + [EOS]):
        matcher.fill_next_token_bitmask(mask, 0)
        if not (int(mask[0, token // 32]) >> (token % 32)) & 1:
            return f"banned at {i}"
        assert matcher.accept_token(token)
    return "violated" if matcher.violated else "accepted"


@pytest.mark.parametrize("name", RUNTIME)
def test_what_no_grammar_says_is_checked_as_values_complete(compiler, name):
    _, schema, bad, good = next(p for p in PROBES if p[0] == name)
    fmt = schema.get("format")
    if fmt is not None and fmt not in jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers:
        pytest.skip(f"no checker for format {fmt!r} installed (jsonschema's extras)")
    assert runtime_schema(S(json=schema)) is not None
    assert walk(checked_matcher(compiler, schema), bad) != "accepted", bad
    assert walk(checked_matcher(compiler, schema), good) == "accepted", good


def test_a_repeated_item_is_refused_where_it_would_complete(compiler):
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    matcher = checked_matcher(compiler, schema)
    # The second "ab" cannot close: its quote is banned, so the model writes on.
    assert walk(matcher, '["ab", "ab"]') == "banned at 10"
    assert walk(checked_matcher(compiler, schema), '["ab", "abc"]') == "accepted"


def test_nested_values_are_checked_at_their_place(compiler):
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^(?!x)[a-z]+$"},  # a lookahead
            "n": {"type": "number", "multipleOf": 0.5},
        },
        "required": ["code", "n"],
    }
    assert walk(checked_matcher(compiler, schema), '{"code": "xy", "n": 1}').startswith("banned")
    assert walk(checked_matcher(compiler, schema), '{"code": "ab", "n": 1.3}').startswith("banned")
    assert walk(checked_matcher(compiler, schema), '{"code": "ab", "n": 1.5}') == "accepted"


def test_rollback_forgets_the_values_it_undoes(compiler):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    matcher = checked_matcher(compiler, schema)
    for c in "[1, 2, ":
        assert matcher.accept_token(CHARS.index(c))
    matcher.rollback(3)  # back to "[1, "
    for c in "3, ":
        assert matcher.accept_token(CHARS.index(c))
    assert matcher.tracker.stack[0].value == [1, 3]


def test_a_schema_never_makes_the_server_fetch_a_url(monkeypatch):
    """A client's `$ref` to a URL (say, a cloud metadata address) is not retrieved while
    values are checked: the check cannot judge such a value and lets it be."""
    import urllib.request

    def fetch(*args, **kwargs):
        raise AssertionError("the server fetched a URL named by a client's schema")

    monkeypatch.setattr(urllib.request, "urlopen", fetch)
    schema = {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/x"}}}
    checks = SchemaChecks(schema)
    assert checks.valid(("a",), 1) and checks.valid((), {"a": 1})


def test_an_object_item_that_would_repeat_is_refused_before_its_forced_close(compiler):
    """The item's last string closes, and the grammar forces its `}`: a repeat is refused
    at the quote, while the string can still grow."""
    item = {
        "type": "object",
        "properties": {"k": {"type": "string"}},
        "required": ["k"],
        "additionalProperties": False,
    }
    schema = {"type": "array", "items": item, "uniqueItems": True}
    text = '[{"k": "a"}, {"k": "a"}]'
    assert walk(checked_matcher(compiler, schema), text) == f"banned at {text.rindex('a') + 1}"
    assert walk(checked_matcher(compiler, schema), '[{"k": "a"}, {"k": "ab"}]') == "accepted"


def test_a_draft_that_breaks_the_schema_is_forgotten_when_rolled_back(compiler):
    """Speculative drafts are walked through the matcher and rolled back: a violation
    they caused must not outlive them."""
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    matcher = checked_matcher(compiler, schema)
    for c in '["a", "a"':
        assert matcher.accept_token(CHARS.index(c))
    assert matcher.violated
    matcher.rollback(2)  # back to '["a", "'
    assert matcher.violated is None
    for c in 'b"]':
        assert matcher.accept_token(CHARS.index(c))
    assert matcher.violated is None
