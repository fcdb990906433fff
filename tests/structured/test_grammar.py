"""Turning StructuredOutputsParams into grammars: what is accepted, and the errors users see."""

from __future__ import annotations

import json

import jsonschema
import pytest
from schema_cases import SCHEMA_CASES
from schema_instances import INSTANCES

from cadence.sampling_params import SamplingParams
from cadence.sampling_params import StructuredOutputsParams as S
from cadence.structured.grammar import (
    cache_key,
    normalize_schema,
    runtime_schema,
    to_grammar,
    unsupported_features,
)


def accepts(grammar, text: str) -> bool:
    """Whether the grammar lets a generation produce exactly `text` and stop there."""
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(
        compiler.compile_grammar(grammar), terminate_without_stop_token=True
    )
    return matcher.accept_string(text) and matcher.is_terminated()


def test_every_schema_case_has_instances():
    assert set(INSTANCES) == {name for name, _, _ in SCHEMA_CASES}


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_each_schema_grammar_accepts_a_valid_instance_and_rejects_a_violating_one(case):
    name, _, schema = case
    good, bad = INSTANCES[name]
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    assert validator.is_valid(good) and not validator.is_valid(bad)  # the instances are right
    grammar = to_grammar(S(json=schema))
    assert accepts(grammar, json.dumps(good)), f"{name}: a valid instance is refused"
    assert not accepts(grammar, json.dumps(bad)), f"{name}: a violating instance passes"
    assert not accepts(grammar, json.dumps(good)[:-1]), f"{name}: a cut-off text passes"


@pytest.mark.parametrize(
    ("params", "good", "bad"),
    [
        (S(regex=r"[0-9]{3}-[a-z]+"), "123-abc", "12-abc"),
        (S(choice=["yes", "no"]), "no", "maybe"),
        (S(grammar='root ::= "a" ("b" | "c")*'), "abcb", "abd"),
        (S(json_object=True), '{"k": [1, 2]}', "[1, 2]"),
    ],
)
def test_regex_choice_grammar_and_json_object_accept_and_reject(params, good, bad):
    grammar = to_grammar(params)
    assert accepts(grammar, good)
    assert not accepts(grammar, bad)


def test_schema_may_be_given_as_json_text():
    to_grammar(S(json='{"type": "object", "properties": {"a": {"type": "integer"}}}'))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (S(json='{"type": '), "not valid JSON"),
        (S(json={"type": "foo"}), 'Unsupported type "foo"'),
        (S(json={"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}}), "$defs"),
        (S(json={"type": "string", "pattern": "[a-"}), "Unclosed '['"),
        (S(json={"type": "string", "pattern": "[a-"}), "no regex"),
        (S(regex="(ab"), "parenthesis is not closed"),
        (S(regex="a(?=b)"), "Lookahead is not supported"),
        (S(grammar="root ::= foo"), 'Rule "foo" is not defined'),
        (S(choice=[]), "non-empty list"),
        (S(regex="   "), "must not be empty"),
        (S(), "exactly one of"),
        (S(regex="a", choice=["a"]), "exactly one of"),
    ],
)
def test_bad_input_is_a_value_error_saying_what_is_wrong(params, message):
    with pytest.raises(ValueError, match=None) as info:
        to_grammar(params)
    assert message in str(info.value)
    assert ".cc:" not in str(info.value)  # no C++ source locations for users


def test_keywords_that_cannot_be_enforced_are_refused_with_their_path():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "not": {"type": "string"},  # a property *named* "not" is fine
            "x": {"not": {"type": "string"}},
        },
        "$defs": {"c": {"if": {"type": "string"}, "then": {"minLength": 2}}},
    }
    problems = unsupported_features(schema)
    assert problems == [
        "uniqueItems ('uniqueItems' at #/properties/tags)",
        "negated schemas ('not' at #/properties/x)",
        "conditional schemas (if / then / else) ('if' at #/$defs/c)",
    ]
    with pytest.raises(ValueError, match=r"cannot enforce \(strict\): uniqueItems"):
        to_grammar(S(json=schema, strict=True))
    with pytest.raises(ValueError, match="multipleOf on non-integer"):
        to_grammar(S(json={"type": "number", "multipleOf": 0.5}, strict=True))
    # Not strict: the grammar takes what it can, run-time checks the rest (test_checked.py).
    assert runtime_schema(S(json=schema)) == schema
    to_grammar(S(json=schema))
    to_grammar(S(json={"type": "integer", "multipleOf": 5}))  # this one is enforced
    a_string, a_short = {"a": {"type": "string"}}, {"a": {"maxLength": 2}}
    clash = {"allOf": [{"properties": a_string}, {"properties": a_short}]}
    with pytest.raises(ValueError, match="allOf with more than one"):
        to_grammar(S(json=clash, strict=True))
    to_grammar(S(json={"allOf": [{"type": "object"}, {"required": ["a"]}]}))  # merged


def test_strict_mode_falls_back_when_it_cannot_satisfy_the_schema():
    # Strict mode forbids unnamed items, so minItems without an items schema needs non-strict.
    to_grammar(S(json={"type": "array", "minItems": 2}))
    to_grammar(S(json={"type": "object", "minProperties": 1}))


def test_choices_with_quotes_backslashes_and_newlines():
    to_grammar(S(choice=['say "hi"', "back\\slash", "two\nlines", "é ü"]))


def test_lark_grammars_are_accepted_too():
    to_grammar(S(grammar='start: "yes" | "no"\n'))


def test_cache_key_ignores_key_order_but_not_options():
    a = S(json={"type": "object", "properties": {"a": {"type": "integer"}}})
    b = S(json='{"properties": {"a": {"type": "integer"}}, "type": "object"}')
    assert cache_key(a) == cache_key(b)
    assert cache_key(a) != cache_key(S(json=a.json, any_whitespace=True))
    assert cache_key(S(regex="a+")) != cache_key(S(grammar="a+"))


def test_sampling_params_verify_checks_the_constraint_shape():
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs=S(regex="a", json={"type": "string"})).verify()
    with pytest.raises(ValueError, match="max_whitespace"):
        SamplingParams(structured_outputs=S(json_object=True, max_whitespace=-1)).verify()
    # A plain dict is accepted (msgspec and users alike).
    p = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert p.structured_outputs.choice == ["a", "b"]


def test_older_drafts_are_normalized():
    tuple_schema = {"type": "array", "items": [{"type": "string"}], "additionalItems": False}
    assert normalize_schema(tuple_schema) == {
        "type": "array",
        "prefixItems": [{"type": "string"}],
        "items": False,
    }
    draft4 = {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 9,
        "exclusiveMaximum": False,
    }
    assert normalize_schema(draft4) == {"type": "number", "exclusiveMinimum": 0, "maximum": 9}
    to_grammar(S(json=tuple_schema))
    to_grammar(S(json=draft4))


def test_required_names_without_a_property_still_appear():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}
    assert normalize_schema(schema)["properties"] == {"a": {"type": "string"}, "b": {}}
    assert schema["properties"] == {"a": {"type": "string"}}  # the caller's copy untouched


def test_patterns_xgrammar_would_skip_are_refused_with_their_path_when_strict():
    schema = {
        "type": "object",
        "properties": {"password": {"type": "string", "pattern": "^(?=.*[A-Z]).{8,}$"}},
    }
    with pytest.raises(ValueError, match=r"pattern '\^\(\?=.*' at #/properties/password/pattern"):
        to_grammar(S(json=schema, strict=True))
    assert runtime_schema(S(json=schema)) == schema  # else: checked as the string ends
    to_grammar(S(json={"type": "string", "pattern": "^[a-z]+@example\\.com$"}))
