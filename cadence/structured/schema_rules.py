"""Which JSON-schema keywords xgrammar enforces, and what to do about the others.

xgrammar builds a grammar from a schema but silently ignores some keywords (it accepts
the schema, then lets through outputs that fail the user's validator). Each rule here was
found by probing xgrammar 0.2 (tests/structured/keyword_probes.py; the corpus sweep in
benchmarks/structured_schema_sweep.py prints the verdicts). Two remedies:

- enforce by tightening (tighten()): rewrite the schema into one xgrammar enforces whose
  every instance is valid for the original (a subset, never a superset):
    * a schema without `type` whose keywords all belong to some types (`minLength`,
      `minimum`, `required`, ...) gets those types: xgrammar reads an untyped schema as
      "any value" and would ignore the keywords;
    * `enum` / `const` beside `type`, lengths, bounds or a pattern: the values that fail
      them are dropped, and so are the keywords (xgrammar reads only the values);
    * constraints beside an anyOf / oneOf move into each branch (xgrammar enforces only
      the combinator), and a branch that cannot match them is dropped;
    * a local `$ref` beside constraints, or as a branch of such an anyOf / oneOf, is
      replaced by what it points at unless it is recursive (inline_refs: xgrammar reads a
      `$ref` alone);
    * a pattern beside `minLength` / `maxLength` gets the bounds in its open repetitions
      (`^[a-z]+$`, maxLength 64 -> `^[a-z]{1,64}$`): xgrammar applies the pattern and
      ignores the lengths;
    * a `format` JSON schema does not define (OpenAPI's `int32`, CloudFormation's
      `AWS::EC2::VPC.Id`) is dropped: it is an annotation, and xgrammar skips it anyway;
    * `patternProperties` on an object that allows other properties: other properties are
      forbidden (xgrammar would let pattern-matching names take any value).
- refuse (schema_refusals): list what remains, with where it sits, so the API answers 400.

Keywords that only annotate (`title`, `description`, `default`, `examples`, `$comment`,
`deprecated`, `readOnly`, `writeOnly`, `contentEncoding`, ...) and unknown keywords (JSON
schema ignores them too) are always accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from cadence.structured.pattern_bounds import bounded_pattern

# Formats defined by JSON schema that xgrammar does not check (it treats them as any
# string). Formats JSON schema does not define (OpenAPI's int32, a tool's "color") are
# annotations: no standard validator checks them, so they are accepted.
UNCHECKED_FORMATS = {"idn-email", "idn-hostname", "iri", "iri-reference", "regex"}

# Formats xgrammar checks (probed: it rejects a string that is not one).
XGRAMMAR_FORMATS = {
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uri-template",
    "uuid",
    "json-pointer",
    "relative-json-pointer",
}

# Keywords that constrain one kind of value; in a schema without `type` xgrammar ignores
# them (it infers the type only from properties / additionalProperties / items).
TYPE_KEYWORDS = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
    "object": (
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
    ),
}
VALUE_KEYWORDS = {kw for kws in TYPE_KEYWORDS.values() for kw in kws} | {"type"}
COMBINATORS = ("anyOf", "oneOf", "allOf")

# Where subschemas sit: keyword -> how its value holds them.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = (
    "additionalProperties",
    "items",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)

_JSON_TYPES = {
    "null": (type(None),),
    "boolean": (bool,),
    "string": (str,),
    "object": (dict,),
    "array": (list,),
}


def subschemas_here(schema: dict) -> Iterator[tuple[str, Any]]:
    """(keyword path, subschema) for the schemas directly inside `schema` (one level)."""
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield f"{key}/{name}", sub
    for key in (*SCHEMA_LISTS, "items"):  # items: a draft 4-7 tuple
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield f"{key}/{i}", sub
    for key in SCHEMA_VALUES:
        if key in schema:
            yield key, schema[key]


def subschemas(schema: Any, path: str = "#") -> Iterator[tuple[str, dict]]:
    """(path, schema) for `schema` and every schema nested in it, depth first."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for where, sub in subschemas_here(schema):
        yield from subschemas(sub, f"{path}/{where}")


# ---- inlining references ---------------------------------------------------------------


def inline_refs(root: Any) -> Any:
    """A copy of `root` where a local `$ref` that xgrammar would read alone is replaced by
    the schema it points at: a `$ref` beside constraints (`{$ref: Tag, maxItems: 20}`;
    xgrammar ignores the siblings), and the `$ref` branches of an anyOf / oneOf beside
    constraints (so that tighten can move the constraints into them). References that
    lead back to themselves stay (a recursive schema cannot be inlined)."""
    return _inline(root, root, 0)


_MAX_INLINE_DEPTH = 8


def _constrains(s: dict, also: tuple[str, ...] = ()) -> bool:
    keep = {"$ref", "$defs", "definitions", *_ANNOTATIONS, *also}
    return not is_annotation_only(set(s) - keep) or any(k in s for k in COMBINATORS)


def _inline(root: Any, s: Any, depth: int) -> Any:
    if not isinstance(s, dict):
        return s
    out = dict(s)
    if depth < _MAX_INLINE_DEPTH and isinstance(out.get("$ref"), str) and _constrains(out):
        target = _inline_target(root, out["$ref"])
        if target is not None:
            merged = _merge(target, {k: v for k, v in out.items() if k != "$ref"})
            if isinstance(merged, dict):
                return _inline(root, merged, depth + 1)
    combinator = next((k for k in COMBINATORS if isinstance(out.get(k), list)), None)
    merging = combinator == "allOf" and len(out[combinator]) > 1  # see _merge_all_of
    if combinator and depth < _MAX_INLINE_DEPTH and (merging or _constrains(out, (combinator,))):
        branches = []
        for b in out[combinator]:
            only_ref = isinstance(b, dict) and "$ref" in b and not _constrains(b)
            target = _inline_target(root, b["$ref"]) if only_ref else None
            branches.append(b if target is None else _inline(root, target, depth + 1))
        out[combinator] = branches
    for key in (*SCHEMA_MAPS, "dependencies"):
        if isinstance(out.get(key), dict):
            out[key] = {n: _inline(root, v, depth) for n, v in out[key].items()}
    for key in (*SCHEMA_LISTS, "items"):
        if isinstance(out.get(key), list):
            out[key] = [_inline(root, v, depth) for v in out[key]]
    for key in (*SCHEMA_VALUES, "additionalItems"):
        if isinstance(out.get(key), dict):
            out[key] = _inline(root, out[key], depth)
    return out


def _inline_target(root: Any, ref: str) -> dict | None:
    """The schema `ref` points at, if local and not leading back to itself."""
    target = resolve_ref(root, {"$ref": ref})
    if target is None or _reaches(root, target, ref):
        return None
    return target


def _reaches(root: Any, schema: dict, ref: str, limit: int = 200) -> bool:
    """Whether following the references inside `schema` can come back to `ref` (or takes
    more than `limit` steps, counted as yes)."""
    seen: set[str] = set()
    todo = [schema]
    while todo:
        for _, sub in subschemas(todo.pop()):
            r = sub.get("$ref")
            if not isinstance(r, str) or r in seen:
                continue
            if r == ref or len(seen) >= limit:
                return True
            seen.add(r)
            nxt = resolve_ref(root, {"$ref": r})
            if nxt is not None:
                todo.append(nxt)
    return False


# ---- tightening ------------------------------------------------------------------------


def tighten(schema: dict) -> dict:
    """One schema's own keywords rewritten as described in the module docstring. The
    caller (normalize_schema) applies it to every subschema, children first."""
    out = _distribute(_merge_all_of(dict(schema)))
    if "type" not in out and not any(k in out for k in ("enum", "const", "$ref", *COMBINATORS)):
        kinds = [t for t, kws in TYPE_KEYWORDS.items() if any(k in out for k in kws)]
        if kinds:
            out["type"] = kinds[0] if len(kinds) == 1 else kinds
    if "enum" in out or "const" in out:
        out = _filter_values(out)
    if isinstance(out.get("format"), str) and out["format"] not in XGRAMMAR_FORMATS | set(
        UNCHECKED_FORMATS
    ):
        del out["format"]  # an annotation (JSON schema does not define it); xgrammar skips it
    if isinstance(out.get("pattern"), str) and ("minLength" in out or "maxLength" in out):
        bounded = bounded_pattern(out["pattern"], out.get("minLength"), out.get("maxLength"))
        if bounded is not None:
            out["pattern"] = bounded
            out.pop("minLength", None)
            out.pop("maxLength", None)
    if isinstance(out.get("patternProperties"), dict) and out.get("additionalProperties", True) in (
        True,
        {},
    ):
        out["additionalProperties"] = False
    return out


_ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
}


def _merge_all_of(out: dict) -> dict:
    """`{allOf: [A, B], ...rest}` -> one schema for rest and A and B, when they combine
    plainly (_merge); xgrammar enforces one allOf member and nothing beside it."""
    members = out.get("allOf")
    if not isinstance(members, list) or not members:
        return out
    if len(members) == 1 and is_annotation_only(set(out) - {"allOf", "$defs", "definitions"}):
        return out  # xgrammar enforces a lone member
    merged: Any = {k: v for k, v in out.items() if k != "allOf"}
    for m in members:
        if m is True:
            continue
        if not isinstance(m, dict) or "$ref" in m or "allOf" in m:
            return out
        merged = _merge(merged, m)
        if not isinstance(merged, dict):
            return out  # not expressible, or no value can match: refused later
    return tighten(merged)


def _distribute(out: dict) -> dict:
    """`{type: object, required: [a], anyOf: [A, B]}` -> `{anyOf: [A + rest, B + rest]}`:
    xgrammar enforces only the combinator, so the constraints beside it move into each
    branch (exact for anyOf and oneOf alike). Left unchanged when a branch cannot take
    them plainly (a $ref, a conflicting keyword); the refusal then names it."""
    combinators = [k for k in COMBINATORS if k in out]
    if len(combinators) != 1 or combinators[0] == "allOf":
        return out
    key = combinators[0]
    branches = out[key]
    keep = {"$defs", "definitions", *_ANNOTATIONS}
    rest = {k: v for k, v in out.items() if k != key and k not in keep}
    if not rest or not isinstance(branches, list):
        return out
    merged = []
    for branch in branches:
        if branch is True:
            branch = {}
        if not isinstance(branch, dict) or any(k in branch for k in ("$ref", *COMBINATORS)):
            return out
        both = _merge(rest, branch)
        if both is None:
            return out
        if both is not False:  # a branch that no value can match is dropped
            merged.append(tighten(both))
    if not merged:
        return out
    return {**{k: v for k, v in out.items() if k in keep}, key: merged}


def _merge(a: dict, b: dict) -> dict | bool | None:
    """A schema for "a and b", False if none can match, None if not plainly expressible."""
    out = dict(a)
    for k, v in b.items():
        if k not in out or out[k] == v or k in _ANNOTATIONS:
            out.setdefault(k, v)
        elif k == "type":
            ta, tb = type_set(out), type_set(b)
            if ta is None or tb is None:
                return None
            both = _with_integer(ta) & _with_integer(tb)
            if "number" in both:
                both.discard("integer")
            if not both:
                return False
            out["type"] = sorted(both)[0] if len(both) == 1 else sorted(both)
        elif k == "required" and isinstance(v, list) and isinstance(out[k], list):
            out[k] = out[k] + [n for n in v if n not in out[k]]
        elif k == "properties" and isinstance(v, dict) and isinstance(out[k], dict):
            props = dict(out[k])
            for name, sub in v.items():
                mine = props.get(name, {})
                if mine in ({}, True) or mine == sub:
                    props[name] = sub
                elif sub not in ({}, True):  # both constrain it: not plainly expressible
                    return None
            out[k] = props
        else:
            return None
    # Closing keywords judge "other" properties by their own side's `properties` only.
    for x, y in ((a, b), (b, a)):
        if any(k in x for k in ("additionalProperties", "patternProperties")):
            extra = set(y.get("properties", {})) - set(x.get("properties", {}))
            if extra:
                return None
    return out


_VALUE_CHECKS = ("minLength", "maxLength", "pattern", "minimum", "maximum")
_VALUE_CHECKS += ("exclusiveMinimum", "exclusiveMaximum")


def _filter_values(out: dict) -> dict:
    """`enum` / `const` beside `type` or simple bounds: keep the values that satisfy them
    and drop the bounds (xgrammar reads only the values). Exact, not a tightening."""
    values = out["enum"] if "enum" in out else [out.get("const")]
    if not isinstance(values, list):
        return out
    checks = {k: out[k] for k in _VALUE_CHECKS if k in out}
    types = type_set(out)
    try:
        kept = [
            v
            for v in values
            if (types is None or _json_type_in(v, types)) and _satisfies(v, checks)
        ]
    except (re.error, TypeError):  # a pattern Python cannot read, a bound not a number
        return out
    out = {k: v for k, v in out.items() if k not in checks}
    if "enum" in out:
        out["enum"] = kept
    elif not kept:  # the const fails the rest: an empty enum, so xgrammar's error says so
        del out["const"]
        out["enum"] = []
    return out


def _satisfies(v: Any, checks: dict) -> bool:
    if isinstance(v, str):
        if "minLength" in checks and len(v) < checks["minLength"]:
            return False
        if "maxLength" in checks and len(v) > checks["maxLength"]:
            return False
        if "pattern" in checks and re.search(checks["pattern"], v) is None:
            return False
    if isinstance(v, int | float) and not isinstance(v, bool):
        bounds = (
            ("minimum", lambda b: v >= b),
            ("maximum", lambda b: v <= b),
            ("exclusiveMinimum", lambda b: v > b),
            ("exclusiveMaximum", lambda b: v < b),
        )
        if any(k in checks and not test(checks[k]) for k, test in bounds):
            return False
    return True


def _with_integer(types: set[str]) -> set[str]:
    return types | {"integer"} if "number" in types else types


def type_set(schema: dict) -> set[str] | None:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    return None


def _json_type_in(value: Any, types: set[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return bool(types & {"integer", "number"})
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    return any(isinstance(value, _JSON_TYPES.get(t, ())) for t in types)


def is_annotation_only(keys: set[str]) -> bool:
    return not (keys & (VALUE_KEYWORDS | {"enum", "const", "$ref", *COMBINATORS}))


def resolve_ref(root: Any, s: Any, hops: int = 8) -> Any:
    """`s`, or what its local `$ref` points at (a few hops at most); None if unknown."""
    while isinstance(s, dict) and isinstance(s.get("$ref"), str) and hops > 0:
        ref = s["$ref"]
        if ref != "#" and not ref.startswith("#/"):
            return None
        s = root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(s, dict) and part in s:
                s = s[part]
            elif isinstance(s, list) and part.isdigit() and int(part) < len(s):
                s = s[int(part)]
            else:
                return None
        hops -= 1
    return s if isinstance(s, dict) and "$ref" not in s else None
