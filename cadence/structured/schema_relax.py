"""The grammar's part of a schema that xgrammar cannot wholly enforce (not `strict`).

    relaxed = relax(schema)     a schema every valid instance of `schema` satisfies, in
                                the part of the dialect xgrammar enforces

What it cannot enforce is dropped from the grammar's copy and checked at run time instead
(structured/checked.py: each value against the user's schema as it completes, the whole
output at its end). Dropping a constraint only ever widens the grammar, so the run-time
checks see every valid output still possible:

    not, if/then/else, dependencies, dependentRequired / Schemas, unevaluated*, contains,
    uniqueItems, multipleOf on numbers, $dynamicRef ...     dropped
    allOf [A, B, ...] that could not be merged               A (each instance satisfies A)
    oneOf whose branches may overlap                          kept: xgrammar reads it as
                                                              anyOf (more than one may match)
    a pattern xgrammar cannot read (lookaround, \\p, \\b ...) dropped (its string lengths
                                                               then count)
    format xgrammar does not check (regex, idn-email ...)     dropped
    pattern beside format                                     the pattern dropped (or the
                                                              format, if xgrammar skips it)
    $ref outside the schema, false                            {} (any value)
    patternProperties xgrammar cannot honour                  any property allowed
"""

from __future__ import annotations

from typing import Any

from cadence.structured.schema_refusals import IGNORED_KEYWORDS
from cadence.structured.schema_rules import (
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_VALUES,
    UNCHECKED_FORMATS,
    XGRAMMAR_FORMATS,
)

_DROPPED = {*IGNORED_KEYWORDS, "then", "else", "uniqueItems"}


def relax(schema: Any, readable: Any) -> Any:
    """`schema` (normalized) without what xgrammar cannot enforce; `readable(pattern)`
    says whether xgrammar reads a regex as JSON schema means it."""
    if schema is False:
        return {}
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k not in _DROPPED}
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: relax(sub, readable) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [relax(sub, readable) for sub in out[key]]
    for key in SCHEMA_VALUES:
        if isinstance(out.get(key), dict | bool) and key in out:
            out[key] = relax(out[key], readable) if out[key] is not False else False
    ref = out.get("$ref")
    if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
        return {}
    multiple = out.get("multipleOf")
    if multiple is not None and not (out.get("type") == "integer" and isinstance(multiple, int)):
        del out["multipleOf"]
    if isinstance(out.get("allOf"), list) and len(out["allOf"]) > 1:
        out["allOf"] = out["allOf"][:1]
    if "format" in out and "pattern" in out:  # the grammar keeps the one it checks
        del out["pattern" if out["format"] in XGRAMMAR_FORMATS else "format"]
    if out.get("format") in UNCHECKED_FORMATS:
        del out["format"]
    if isinstance(out.get("pattern"), str) and not readable(out["pattern"]):
        del out["pattern"]
    names = out.get("patternProperties")
    if isinstance(names, dict) and (
        out.get("additionalProperties") is not False or not all(readable(p) for p in names)
    ):
        del out["patternProperties"]
        out["additionalProperties"] = True
    return out
