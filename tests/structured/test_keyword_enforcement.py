"""Structured outputs never claim success wrongly (issue 14, point 11): every JSON-schema
keyword is either enforced by the grammar cadence builds (a violating text is rejected) or
refused with a 400 naming it and where it sits. The probes are in keyword_probes.py; the
corpus sweep (benchmarks/structured_schema_sweep.py) runs the same probes against raw
xgrammar, which ignores every keyword listed in REFUSED and several of the enforced ones
(cadence rewrites those)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from keyword_probes import PROBES

from cadence.sampling_params import StructuredOutputsParams as S
from cadence.structured.grammar import normalize_schema, to_grammar, unsupported_features

# probe -> what the refusal says (besides the path)
REFUSED = {
    "multipleOf-number": "multipleOf on non-integer numbers ('multipleOf' at #)",
    "format-regex": "format 'regex' ('format' at #)",
    "format-idn-email": "format 'idn-email' ('format' at #)",
    "format-iri": "format 'iri' ('format' at #)",
    "pattern-with-format": "pattern together with format ('pattern' at #)",
    "format-with-maxLength": "minLength / maxLength beside a pattern or format",
    "uniqueItems": "uniqueItems ('uniqueItems' at #)",
    "contains": "contains ('contains' at #)",
    "oneOf-overlapping": "oneOf whose branches may overlap ('oneOf' at #",
    "oneOf-beside-type": "oneOf whose branches may overlap ('oneOf' at #",
    "allOf-clashing": "allOf with more than one schema ('allOf' at #)",
    "ref-anchor": "$ref other than to this schema ('$ref' at #: '#i')",
    "ref-external": "$ref other than to this schema",
    "boolean-schema-false": "cannot accept any value",  # xgrammar's own error
    "pattern-unicode-class": "at #/pattern: the escape \\p is not supported",
}
# Enforced, but stricter than the schema: the valid text is rejected too. xgrammar writes
# objects in one layout and counts an escape as several characters; it generates no
# property matching patternProperties; cadence gives untyped keywords their type (so `1`
# no longer satisfies {"minLength": 3}). Never a wrong success, so not refused.
STRICTER = {
    "enum-object",
    "const-object",
    "maxLength-escapes",
    "patternProperties",
    "patternProperties-closed",
    "minimum-untyped",
    "pattern-untyped",
    "minLength-untyped",
    "format-untyped",
}
ENFORCED = [p for p in PROBES if p[0] not in REFUSED]


def accepts(grammar, text: str) -> bool:
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(
        compiler.compile_grammar(grammar), terminate_without_stop_token=True
    )
    return matcher.accept_string(text) and matcher.is_terminated()


@pytest.mark.parametrize("probe", PROBES, ids=[p[0] for p in PROBES])
def test_each_probe_violates_its_schema(probe):
    name, schema, bad, good = probe
    if name == "ref-external":
        pytest.skip("jsonschema would fetch the reference")
    if name == "pattern-unicode-class":
        pytest.skip("Python's re, which jsonschema uses, has no \\p")
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    assert validator.is_valid(json.loads(good))
    fmt = schema.get("format")
    if fmt is None or fmt in checker.checkers or fmt == "int32":  # else: no checker installed
        assert not validator.is_valid(json.loads(bad))


@pytest.mark.parametrize("probe", ENFORCED, ids=[p[0] for p in ENFORCED])
def test_enforced_keywords_reject_the_violating_text(probe):
    name, schema, bad, good = probe
    grammar = to_grammar(S(json=schema))
    assert not accepts(grammar, bad), f"{name}: {bad} passes the grammar"
    assert accepts(grammar, good) != (name in STRICTER)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_strict_refuses_what_no_grammar_enforces_saying_what_and_where(name):
    schema = next(p[1] for p in PROBES if p[0] == name)
    with pytest.raises(ValueError) as info:
        to_grammar(S(json=schema, strict=True))
    assert REFUSED[name] in str(info.value)


def test_annotations_and_unknown_keywords_are_accepted():
    annotated = {
        "title": "T",
        "description": "d",
        "$comment": "c",
        "examples": [{"a": 1}],
        "default": {"a": 1},
        "deprecated": True,
        "readOnly": True,
        "writeOnly": False,
        "x-vendor": {"anything": [1]},
        "markdownDescription": "m",
        "type": "object",
        "properties": {"a": {"type": "string", "contentEncoding": "base64", "format": "int32"}},
    }
    assert unsupported_features(annotated) == []
    to_grammar(S(json=annotated))


def test_refusals_name_the_path_in_a_nested_schema():
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"$ref": "https://x.org/tag"}}},
    }
    assert unsupported_features(schema) == [
        "$ref other than to this schema ('$ref' at #/properties/tags/items: 'https://x.org/tag')"
    ]


def test_open_repetitions_carry_the_length_bounds():
    schema = {
        "type": "string",
        "pattern": "^arn:aws:iam::[0-9]{12}:role/[a-zA-Z0-9+=,.@_-]+$",
        "minLength": 20,
        "maxLength": 64,
    }
    out = normalize_schema(schema)
    assert out == {
        "type": "string",
        "pattern": "^arn:aws:iam::[0-9]{12}:role/[a-zA-Z0-9+=,.@_-]{1,33}$",
    }
    grammar = to_grammar(S(json=schema))
    prefix = "arn:aws:iam::123456789012:role/"  # 31 characters, so 33 are left
    assert accepts(grammar, json.dumps(prefix + "r" * 33))
    assert not accepts(grammar, json.dumps(prefix + "r" * 34))
    # A pattern that already implies the bounds is kept as it is.
    uuid = {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}$", "maxLength": 13}
    assert normalize_schema(uuid) == {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}$"}


def test_untyped_keywords_get_their_type_and_enum_values_their_type():
    assert normalize_schema({"minLength": 2})["type"] == "string"
    assert normalize_schema({"required": ["a"]}) == {
        "required": ["a"],
        "type": "object",
        "properties": {"a": {}},
    }
    assert normalize_schema({"minimum": 1, "maxLength": 3})["type"] == ["string", "number"]
    assert normalize_schema({"type": "integer", "enum": [1, "a", 2.0, True]})["enum"] == [1, 2.0]


def test_enum_values_that_fail_the_bounds_beside_them_are_dropped():
    methods = {"type": "string", "enum": ["GET", "DELETE", "*"], "maxLength": 4, "minLength": 1}
    assert normalize_schema(methods) == {"type": "string", "enum": ["GET", "*"]}
    assert normalize_schema({"const": 5, "minimum": 1, "pattern": "^x"}) == {"const": 5}
    assert normalize_schema({"const": 0, "minimum": 1}) == {"enum": []}
    assert normalize_schema({"enum": ["ab", "b1"], "pattern": "[0-9]"}) == {"enum": ["b1"]}


def test_constraints_beside_anyof_move_into_each_branch():
    schema = {
        "type": "object",
        "title": "kept",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    props = schema["properties"]
    assert normalize_schema(schema) == {
        "title": "kept",
        "anyOf": [
            {"type": "object", "properties": props, "required": ["a"]},
            {"type": "object", "properties": props, "required": ["b"]},
        ],
    }
    grammar = to_grammar(S(json=schema))
    assert not accepts(grammar, "{}")
    assert accepts(grammar, '{"b": 2}')
    # A branch of another type cannot match: it is dropped.
    typed = {"type": "string", "anyOf": [{"type": "integer"}, {"maxLength": 2}]}
    assert normalize_schema(typed) == {"anyOf": [{"type": "string", "maxLength": 2}]}


def test_oneof_overlap_is_judged_on_the_schema_as_written():
    # Tightening would type the first branch as a number, but the user's validator sees
    # every string match it, so a string output would match both branches.
    schema = {"oneOf": [{"minimum": 3}, {"type": "string"}]}
    assert "oneOf whose branches may overlap" in unsupported_features(schema)[0]
    # Branches told apart by types, a forbidden property or a const discriminator pass.
    nb_cells = {
        "$defs": {
            "raw": {
                "type": "object",
                "properties": {"cell_type": {"enum": ["raw"]}},
                "required": ["cell_type"],
            },
            "code": {
                "type": "object",
                "properties": {"cell_type": {"enum": ["code"]}, "source": {"type": "string"}},
                "required": ["cell_type", "source"],
            },
        },
        "oneOf": [{"$ref": "#/$defs/raw"}, {"$ref": "#/$defs/code"}],
    }
    closed = {
        "oneOf": [
            {"type": "object", "properties": {"a": {}}, "required": ["a"]},
            {
                "type": "object",
                "properties": {"b": {}},
                "required": ["b"],
                "additionalProperties": False,
            },
        ]
    }
    assert unsupported_features(nb_cells) == unsupported_features(closed) == []


def test_enum_values_and_property_names_are_not_rewritten_as_schemas():
    schema = {
        "type": "object",
        "properties": {"items": {"type": "string"}, "minimum": {"type": "integer"}},
        "default": {"required": ["x"]},
        "examples": [{"items": [1, 2]}],
    }
    assert normalize_schema(schema) == schema


def test_a_ref_beside_constraints_is_inlined_and_recursive_refs_stay():
    tags = {
        "definitions": {"Tag": {"type": "array", "items": {"type": "string"}}},
        "type": "object",
        "properties": {"tags": {"$ref": "#/definitions/Tag", "maxItems": 2}},
    }
    grammar = to_grammar(S(json=tags))
    assert accepts(grammar, '{"tags": ["a", "b"]}')
    assert not accepts(grammar, '{"tags": ["a", "b", "c"]}')
    # A oneOf of $refs beside `type`: inlined, typed, told apart by their discriminator.
    cells = {
        "definitions": {
            "raw": {"properties": {"k": {"const": "raw"}}, "required": ["k"]},
            "md": {"properties": {"k": {"const": "md"}}, "required": ["k"]},
        },
        "type": "object",
        "oneOf": [{"$ref": "#/definitions/raw"}, {"$ref": "#/definitions/md"}],
    }
    assert not accepts(to_grammar(S(json=cells)), '{"k": "other"}')
    tree = {
        "$defs": {"node": {"type": "object", "properties": {"kids": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node",
        "maxProperties": 1,
    }
    assert "$ref beside other constraints ('$ref' at #)" in unsupported_features(tree)
