"""What xgrammar would still ignore in a schema after schema_rules' rewrites: each found
constraint is named with where it sits ('what (keyword at #/path)'), and the API answers
400 with the list. See schema_rules for how each rule was found.
"""

from __future__ import annotations

from typing import Any

from cadence.structured.schema_rules import (
    COMBINATORS,
    UNCHECKED_FORMATS,
    is_annotation_only,
    resolve_ref,
    subschemas,
    type_set,
)

# Keywords whose constraint xgrammar ignores wherever they appear.
IGNORED_KEYWORDS = {
    "not": "negated schemas",
    "if": "conditional schemas (if / then / else)",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "unevaluatedProperties": "unevaluatedProperties",
    "unevaluatedItems": "unevaluatedItems",
    "contains": "contains",
    "minContains": "minContains",
    "maxContains": "maxContains",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}


def unenforced(schema: Any) -> list[str]:
    """'what (keyword at path)' for each constraint in a tightened schema that xgrammar
    would ignore."""
    found: list[str] = []
    for path, s in subschemas(schema):
        found += unenforced_here(s, path)
    return found


def overlapping_one_ofs(schema: Any) -> list[str]:
    """The same for oneOf, which xgrammar reads as anyOf: refused unless its branches are
    disjoint. Judged on the user's schema, not the tightened one: tightening may make
    branches disjoint (a type inferred) that the user's validator sees overlap."""
    found = []
    for path, s in subschemas(schema):
        if isinstance(s.get("oneOf"), list) and not _disjoint(schema, s["oneOf"]):
            found.append(
                f"oneOf whose branches may overlap ('oneOf' at {path}: enforced as anyOf; "
                "give the branches distinct types or a const discriminator, or use anyOf)"
            )
    return found


def unenforced_here(s: dict, path: str) -> list[str]:
    found = [f"{what} ('{key}' at {path})" for key, what in IGNORED_KEYWORDS.items() if key in s]
    keys = set(s)
    multiple = s.get("multipleOf")
    if multiple is not None and not (s.get("type") == "integer" and isinstance(multiple, int)):
        # xgrammar enforces multipleOf on integer schemas with an integer divisor only.
        found.append(f"multipleOf on non-integer numbers ('multipleOf' at {path})")
    if s.get("uniqueItems") is True:
        found.append(f"uniqueItems ('uniqueItems' at {path})")
    if isinstance(s.get("allOf"), list) and len(s["allOf"]) > 1:
        found.append(f"allOf with more than one schema ('allOf' at {path})")
    combinators = [k for k in COMBINATORS if k in s]
    if combinators:
        rest = keys - set(combinators) - {"$defs", "definitions"}
        if len(combinators) > 1 or not is_annotation_only(rest):
            found.append(
                f"{combinators[0]} beside other constraints ('{combinators[0]}' at {path}: "
                "only the combinator is enforced; move the constraints into each branch)"
            )
    ref = s.get("$ref")
    if ref is not None:
        if not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
            found.append(f"$ref other than to this schema ('$ref' at {path}: {ref!r})")
        elif not is_annotation_only(keys - {"$ref", "$defs", "definitions"}):
            found.append(f"$ref beside other constraints ('$ref' at {path})")
    if "enum" in s or "const" in s:
        rest = keys - {"enum", "const", "type", "$defs", "definitions"}
        if not is_annotation_only(rest):
            found.append(f"enum or const beside other constraints ('enum' at {path})")
    if "format" in s:
        if s["format"] in UNCHECKED_FORMATS:
            found.append(f"format {s['format']!r} ('format' at {path})")
        if "pattern" in s:
            found.append(f"pattern together with format ('pattern' at {path})")
    if ("pattern" in s or "format" in s) and ("minLength" in s or "maxLength" in s):
        found.append(
            f"minLength / maxLength beside a pattern or format ('pattern' at {path}: "
            "put the bounds in the pattern)"
        )
    if "patternProperties" in s and s.get("additionalProperties") is not False:
        found.append(
            f"patternProperties with other properties allowed ('patternProperties' at {path})"
        )
    return found


def _kinds(s: Any) -> set[str] | None:
    """The JSON types a branch can take, if plainly stated; None if unknown."""
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return {_type_name(s["const"])}
    if isinstance(s.get("enum"), list):
        return {_type_name(v) for v in s["enum"]}
    types = type_set(s)
    if types is not None and "number" in types:
        types = types | {"integer"}  # every integer is a number
    return types


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(v), "null")


def _required(s: dict) -> set[str]:
    req = s.get("required")
    return {n for n in req if isinstance(n, str)} if isinstance(req, list) else set()


def _property(root: Any, s: dict, name: str) -> Any:
    props = s.get("properties")
    return resolve_ref(root, props.get(name)) if isinstance(props, dict) else None


def _values(s: Any) -> list | None:
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return [s["const"]]
    return s["enum"] if isinstance(s.get("enum"), list) else None


def _never_both(root: Any, a: dict, b: dict) -> bool:
    """True when no value can match both branches (a sufficient test, not a complete one)."""
    ka, kb = _kinds(a), _kinds(b)
    if ka is not None and kb is not None and not (ka & kb):
        return True
    for x, y in ((a, b), (b, a)):
        # x needs a property that y forbids.
        closed = y.get("additionalProperties") is False and "patternProperties" not in y
        if closed and _required(x) - set(y.get("properties") or {}):
            return True
    for name in _required(a) & _required(b):
        pa, pb = _property(root, a, name), _property(root, b, name)
        if pa is None or pb is None:
            continue
        ta, tb = _kinds(pa), _kinds(pb)
        if ta is not None and tb is not None and not (ta & tb):
            return True
        va, vb = _values(pa), _values(pb)
        if va is not None and vb is not None and not _any_equal(va, vb):
            return True
    return False


def _any_equal(va: list, vb: list) -> bool:
    return any(v == w and type(v) is type(w) for v in va for w in vb)


def _disjoint(root: Any, branches: list) -> bool:
    """True when no value can match two of the branches, so that xgrammar's reading of
    oneOf as anyOf is exact: types that differ, a required property one branch forbids,
    or a required property whose types or fixed values differ (a discriminator)."""
    resolved = [resolve_ref(root, b) for b in branches]
    if any(r is None for r in resolved):
        return False
    return all(
        _never_both(root, resolved[i], resolved[j])
        for i in range(len(resolved))
        for j in range(i + 1, len(resolved))
    )
