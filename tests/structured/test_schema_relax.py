"""The grammar's part of a schema (schema_relax.relax): what xgrammar cannot enforce is
dropped, and every valid instance of the schema still satisfies what is left."""

from __future__ import annotations

import jsonschema

from cadence.structured.grammar import pattern_readable
from cadence.structured.schema_relax import relax

SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "code": {"type": "string", "pattern": "^(?!x)[a-z]+$", "maxLength": 8},
        "mail": {"type": "string", "format": "email", "pattern": "^a"},
        "re": {"type": "string", "format": "regex"},
        "n": {"type": "number", "multipleOf": 0.5},
        "k": {"type": "integer", "multipleOf": 5},
        "both": {"allOf": [{"type": "string"}, {"minLength": 2}]},
        "ext": {"$ref": "https://example.com/x"},
        "cond": {"if": {"type": "string"}, "then": {"minLength": 2}, "not": {"const": "zz"}},
    },
    "dependentRequired": {"a": ["b"]},
}
VALID = {
    "tags": ["x", "y"],
    "code": "abc",
    "mail": "a@b.co",
    "re": "[a-z]+",
    "n": 1.5,
    "k": 10,
    "both": "ok",
    "ext": 3,
    "cond": "hi",
}


def test_what_no_grammar_enforces_is_dropped_and_the_rest_kept():
    out = relax(SCHEMA, pattern_readable)
    props = out["properties"]
    assert "dependentRequired" not in out and "uniqueItems" not in props["tags"]
    assert props["code"] == {"type": "string", "maxLength": 8}  # the lookahead went
    assert props["mail"] == {"type": "string", "format": "email"}  # xgrammar checks email
    assert props["re"] == {"type": "string"} and "multipleOf" not in props["n"]
    assert props["k"]["multipleOf"] == 5  # integers: enforced by the grammar
    assert props["both"] == {"allOf": [{"type": "string"}]} and props["ext"] == {}
    assert props["cond"] == {}
    assert SCHEMA["properties"]["tags"]["uniqueItems"] is True  # the caller's copy untouched


def test_every_valid_instance_still_satisfies_the_relaxed_schema():
    local = {**SCHEMA, "properties": {k: v for k, v in SCHEMA["properties"].items() if k != "ext"}}
    jsonschema.validate(VALID, local)  # (jsonschema would fetch the external reference)
    jsonschema.validate(VALID, relax(SCHEMA, pattern_readable))
