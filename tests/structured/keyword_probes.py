"""Probes of what xgrammar enforces: for each JSON-schema keyword (or keyword use), a small
schema, an instance that violates it and one that satisfies it (both checked with the
`jsonschema` package), as JSON text.

A keyword is *enforced* when the grammar xgrammar builds from the schema rejects the
violating text and accepts the valid one; *ignored* when it accepts the violating text (an
output could finish with `stop` and fail the user's validator). Used by the keyword tests
(tests/structured/test_keyword_enforcement.py) and the corpus sweep
(benchmarks/structured_schema_sweep.py), which prints the verdict of each.
"""

from __future__ import annotations

# (name, schema, violating JSON text, valid JSON text)
Probe = tuple[str, dict, str, str]

OBJ = {"type": "object"}

PROBES: list[Probe] = [
    # ---- types, enum, const
    ("type", {"type": "integer"}, '"1"', "1"),
    ("type-list", {"type": ["string", "null"]}, "1", "null"),
    ("enum", {"enum": ["a", 1, None]}, '"b"', "1"),
    ("enum-object", {"enum": [{"a": 1}, [1, 2]]}, '{"a": 2}', "[1, 2]"),
    ("const-string", {"const": "x"}, '"y"', '"x"'),
    ("const-object", {"const": {"a": 1}}, '{"a": 2}', '{"a": 1}'),
    # ---- numbers
    ("minimum-integer", {"type": "integer", "minimum": 3}, "2", "3"),
    ("maximum-integer", {"type": "integer", "maximum": 3}, "4", "3"),
    ("exclusiveMinimum-integer", {"type": "integer", "exclusiveMinimum": 3}, "3", "4"),
    ("exclusiveMaximum-integer", {"type": "integer", "exclusiveMaximum": 3}, "3", "2"),
    ("minimum-number", {"type": "number", "minimum": 1.5}, "1.25", "1.5"),
    ("maximum-number", {"type": "number", "maximum": 1.5}, "1.75", "1.5"),
    ("exclusiveMinimum-number", {"type": "number", "exclusiveMinimum": 1.5}, "1.5", "1.75"),
    ("exclusiveMaximum-number", {"type": "number", "exclusiveMaximum": 1.5}, "1.5", "1.25"),
    ("minimum-untyped", {"minimum": 3}, "2", '"a string is fine"'),
    ("multipleOf-integer", {"type": "integer", "multipleOf": 5}, "7", "10"),
    ("multipleOf-number", {"type": "number", "multipleOf": 0.5}, "0.3", "1.5"),
    # ---- strings
    ("minLength", {"type": "string", "minLength": 3}, '"ab"', '"abc"'),
    ("maxLength", {"type": "string", "maxLength": 3}, '"abcd"', '"abc"'),
    ("maxLength-escapes", {"type": "string", "maxLength": 2}, '"\\n\\n\\n"', '"\\n\\n"'),
    ("pattern", {"type": "string", "pattern": "^[a-z]+$"}, '"aB"', '"ab"'),
    ("pattern-unanchored", {"type": "string", "pattern": "[0-9]"}, '"ab"', '"1"'),
    ("pattern-escaped-char", {"type": "string", "pattern": "^[a-z]$"}, '"\\u0041"', '"a"'),
    # xgrammar reads \p inside a class as the letters "p{L}" (ECMA: any letter).
    ("pattern-unicode-class", {"type": "string", "pattern": "^[\\p{L}]+$"}, '"{"', '"a"'),
    ("pattern-untyped", {"pattern": "^[a-z]+$"}, '"aB"', "1"),
    ("format-date", {"type": "string", "format": "date"}, '"2024-13-45"', '"2024-01-31"'),
    (
        "format-date-time",
        {"type": "string", "format": "date-time"},
        '"yesterday"',
        '"2024-01-31T12:00:00Z"',
    ),
    ("format-time", {"type": "string", "format": "time"}, '"noon"', '"12:00:00Z"'),
    ("format-email", {"type": "string", "format": "email"}, '"nobody"', '"a@b.co"'),
    ("format-ipv4", {"type": "string", "format": "ipv4"}, '"1.2.3"', '"1.2.3.4"'),
    ("format-ipv6", {"type": "string", "format": "ipv6"}, '"::g"', '"::1"'),
    (
        "format-uuid",
        {"type": "string", "format": "uuid"},
        '"123"',
        '"123e4567-e89b-12d3-a456-426614174000"',
    ),
    ("format-uri", {"type": "string", "format": "uri"}, '"no scheme"', '"https://a.b/c"'),
    ("format-hostname", {"type": "string", "format": "hostname"}, '"a..b"', '"a.b"'),
    ("format-duration", {"type": "string", "format": "duration"}, '"1 day"', '"P1D"'),
    ("format-regex", {"type": "string", "format": "regex"}, '"[a-"', '"[a-z]"'),
    ("format-idn-email", {"type": "string", "format": "idn-email"}, '"nobody"', '"a@b.co"'),
    ("format-iri", {"type": "string", "format": "iri"}, '"no scheme"', '"https://a.b/c"'),
    ("format-custom (annotation)", {"type": "string", "format": "int32"}, "1", '"1"'),
    (
        "pattern-with-format",
        {"type": "string", "format": "email", "pattern": "^a"},
        '"b@c.de"',
        '"a@c.de"',
    ),
    (
        "pattern-with-maxLength",
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        '"abcd"',
        '"abc"',
    ),
    (
        "complex-pattern-with-maxLength",
        {"type": "string", "pattern": "^a[a-z]*$", "maxLength": 3},
        '"abcd"',
        '"abc"',
    ),
    (
        "format-with-maxLength",
        {"type": "string", "format": "email", "maxLength": 6},
        '"a@bc.de"',
        '"a@b.co"',
    ),
    ("minLength-untyped", {"minLength": 3}, '"a"', "1"),
    ("format-untyped", {"format": "email"}, '"a"', "1"),
    ("format-json-pointer", {"type": "string", "format": "json-pointer"}, '"a/b"', '"/a/b"'),
    # ---- arrays
    ("items", {"type": "array", "items": {"type": "integer"}}, '["a"]', "[1]"),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]", "[1, 2]"),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]", "[1]"),
    ("minItems-no-items", {"type": "array", "minItems": 2}, "[1]", "[1, 2]"),
    (
        "uniqueItems",
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "[1, 1]",
        "[1, 2]",
    ),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}]}, '["a"]', "[1]"),
    (
        "prefixItems-items-false",
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
        "[1, 2]",
        "[1]",
    ),
    (
        "contains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}},
        "[1]",
        "[5]",
    ),
    ("items-false", {"type": "array", "items": False}, "[1]", "[]"),
    # ---- objects
    (
        "properties",
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        '{"a": "x"}',
        '{"a": 1}',
    ),
    (
        "required",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        "{}",
        '{"a": 1}',
    ),
    (
        "additionalProperties-false",
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
        '{"b": 1}',
        '{"a": 1}',
    ),
    (
        "additionalProperties-schema",
        {"type": "object", "additionalProperties": {"type": "integer"}},
        '{"b": "x"}',
        '{"b": 1}',
    ),
    ("minProperties", {"type": "object", "minProperties": 1}, "{}", '{"a": 1}'),
    (
        "maxProperties",
        {"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1},
        '{"a": 1, "b": 2}',
        '{"a": 1}',
    ),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}},
        '{"x-a": "s"}',
        '{"x-a": 1}',
    ),
    (
        "patternProperties-closed",
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
        },
        '{"y": 1}',
        '{"x-a": 1}',
    ),
    (
        "propertyNames",
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        '{"A": 1}',
        '{"a": 1}',
    ),
    (
        "propertyNames-maxLength",
        {"type": "object", "propertyNames": {"maxLength": 2}},
        '{"abc": 1}',
        '{"ab": 1}',
    ),
    ("untyped-properties", {"properties": {"a": {"type": "integer"}}}, '{"a": "x"}', '{"a": 1}'),
    ("required-untyped", {"required": ["a"]}, "{}", '{"a": 1}'),
    (
        "patternProperties-loose",  # minProperties needs xgrammar's non-strict mode
        {
            "type": "object",
            "properties": {"a": {}},
            "patternProperties": {"^x-": {"type": "integer"}},
            "minProperties": 1,
        },
        '{"x-a": "s"}',
        '{"a": 1}',
    ),
    (
        "patternProperties-open",
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": True,
        },
        '{"x-a": "s"}',
        "{}",
    ),
    # ---- combinators
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"a"', "true"),
    ("oneOf-disjoint", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true", "1"),
    ("oneOf-overlapping", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1", "1.5"),
    ("allOf-one", {"allOf": [{"type": "integer"}]}, '"a"', "1"),
    (
        "oneOf-discriminated",
        {
            "oneOf": [
                {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]},
            ]
        },
        '{"k": "c"}',
        '{"k": "a"}',
    ),
    ("anyOf-untyped-branch", {"type": "integer", "anyOf": [{"minimum": 3}]}, "1", "5"),
    (
        "anyOf-required-beside-properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        "{}",
        '{"a": 1}',
    ),
    (
        "oneOf-beside-type",
        {"type": "string", "oneOf": [{"maxLength": 1}, {"pattern": "^[0-9]+$"}]},
        '"abc"',
        '"a"',
    ),
    (
        "allOf-beside-properties",
        {"type": "object", "properties": {"a": {}}, "allOf": [{"required": ["a"]}]},
        "{}",
        '{"a": 1}',
    ),
    (
        "allOf-two",
        {"allOf": [{"type": "object", "properties": {"a": {}}}, {"required": ["a"]}]},
        "{}",
        '{"a": 1}',
    ),
    (
        "allOf-clashing",  # both constrain "a": not merged into one schema
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}},
                {"properties": {"a": {"maxLength": 2}}},
            ]
        },
        '{"a": "abc"}',
        '{"a": "ab"}',
    ),
    # ---- references
    ("ref-local", {"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i"}, '"a"', "1"),
    (
        "ref-with-siblings",
        {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2},
        '"abc"',
        '"ab"',
    ),
    (
        "ref-to-properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}},
        },
        '{"b": "x"}',
        '{"b": 1}',
    ),
    (
        "ref-recursive",
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/n"}},
                }
            },
            "$ref": "#/$defs/n",
        },
        '{"next": {"v": "x"}}',
        '{"next": {"v": 1}}',
    ),
    ("ref-root", {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}, "[[], []]", "[[]]"),
    ("ref-anchor", {"$defs": {"i": {"$anchor": "i", "type": "integer"}}, "$ref": "#i"}, '"a"', "1"),
    ("ref-external", {"$ref": "https://example.com/integer.json"}, '"a"', "1"),
    ("enum-with-maxLength", {"enum": ["aa", "b"], "maxLength": 1}, '"aa"', '"b"'),
    ("enum-with-type", {"type": "integer", "enum": [1, "a"]}, '"a"', "1"),
    ("const-with-type", {"type": "string", "const": "a", "title": "A"}, '"b"', '"a"'),
    ("boolean-schema-false", {"type": "object", "properties": {"a": False}}, '{"a": 1}', "{}"),
    ("nullable (OpenAPI, not JSON schema)", {"type": "string", "nullable": True}, "1", '"a"'),
]
