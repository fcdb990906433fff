"""From a request's StructuredOutputsParams to an xgrammar grammar, with clear errors.

Two stages, as xgrammar splits them:

    to_grammar(params)       tokenizer-free: parse and check the schema / regex / EBNF.
                             Cheap; the API server calls it to answer a bad one with 400.
    compile_grammar(...)     against the model's vocabulary (GrammarCompiler); the engine
                             runs it on a worker thread and caches the result by cache_key.

Schemas are first normalized (normalize_schema: older drafts' tuple and exclusive-bound
spellings, required names without a property). JSON schemas are compiled in xgrammar's strict mode (no properties or items the schema does
not name), falling back to non-strict when strict mode cannot satisfy the schema (say, an
array with minItems and no items schema). Keywords xgrammar would silently ignore are
rewritten so that it enforces them (schema_rules); what no rewrite reaches (uniqueItems, a
lookahead, `not` ...) is taken out of the grammar's copy (schema_relax) and checked at run
time as values complete (checked.py: `runtime_schema` says when), or, with `strict`,
refused: a user never receives, as a success, an output that fails their validator.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from cadence.sampling_params import StructuredOutputsParams
from cadence.structured.ecma_regex import compile_pattern
from cadence.structured.schema_refusals import overlapping_one_ofs, unenforced
from cadence.structured.schema_relax import relax
from cadence.structured.schema_rules import (
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_VALUES,
    inline_refs,
    tighten,
)

_KIND_NAMES = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}

_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+\.cc:\d+: (Check failed: \(.*?\) is false: )?")


def load_schema(schema: dict[str, Any] | str) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
    return schema


def unsupported_features(schema: Any) -> list[str]:
    """'what (keyword at path)' for every constraint in `schema` (as the user wrote it)
    that cannot be enforced, even after normalize_schema's rewrites."""
    return unenforced(normalize_schema(inline_refs(schema))) + overlapping_one_ofs(schema)


def normalize_schema(schema: Any) -> Any:
    """A copy of `schema` in the dialect xgrammar reads, for older drafts' spellings:

    - draft 4-7 tuples, `items: [a, b]` (+ `additionalItems`) -> `prefixItems` (+ `items`);
    - draft 4 boolean `exclusiveMinimum: true` (+ `minimum`) -> `exclusiveMinimum: <number>`;
    - a `required` name with no entry in `properties` gets `{}` (any value): xgrammar would
      otherwise leave it out, and the output would fail the user's validator;
    - then schema_rules.tighten: rewrites that make xgrammar enforce what it would ignore.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)  # only schema positions are rewritten: never enum values, names...
    for key in (*SCHEMA_MAPS, "dependencies"):
        if isinstance(out.get(key), dict):
            out[key] = {name: normalize_schema(sub) for name, sub in out[key].items()}
    for key in (*SCHEMA_LISTS, "items"):
        if isinstance(out.get(key), list):
            out[key] = [normalize_schema(sub) for sub in out[key]]
    for key in (*SCHEMA_VALUES, "additionalItems"):
        if isinstance(out.get(key), dict):
            out[key] = normalize_schema(out[key])
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(exclusive)
        if isinstance(flag, bool):
            del out[exclusive]
            if flag and bound in out:
                out[exclusive] = out.pop(bound)
    out = tighten(out)
    required = out.get("required")
    if isinstance(required, list) and ("properties" in out or out.get("type") == "object"):
        props = dict(out.get("properties", {}))
        if isinstance(out.get("properties", {}), dict):
            for name in required:
                if isinstance(name, str) and name not in props:
                    props[name] = {}
            out["properties"] = props
    return out


def unsupported_patterns(schema: Any, path: str = "#") -> list[str]:
    """'pattern at path: why' for every regex xgrammar cannot enforce (it would skip a
    lookahead, say, and let through strings the user's validator rejects)."""
    import xgrammar as xgr

    found: list[str] = []
    if isinstance(schema, dict):
        patterns = []
        if isinstance(schema.get("pattern"), str):
            patterns.append((schema["pattern"], f"{path}/pattern"))
        if isinstance(schema.get("patternProperties"), dict):
            patterns += [(k, f"{path}/patternProperties") for k in schema["patternProperties"]]
        for pattern, where in patterns:
            letter = _foreign_escape(pattern)
            if letter is not None:
                found.append(
                    f"pattern {pattern!r} at {where}: the escape \\{letter} is not supported"
                )
                continue
            try:
                xgr.Grammar.from_regex(pattern)
            except Exception as e:
                found.append(f"pattern {pattern!r} at {where}: {_clean(e)}")
        for key, value in schema.items():
            if key in ("enum", "const", "examples", "default"):
                continue  # values, not schemas
            found += unsupported_patterns(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += unsupported_patterns(value, f"{path}/{i}")
    return found


# Letter escapes xgrammar reads as JSON schema's regex dialect (ECMA-262) does. It reads
# any other letter escape as the letter itself (`[\\p{L}]` matches "p", "{", "L" and "}"),
# with a warning, where the user's validator means a class or rejects the pattern.
_KNOWN_ESCAPES = set("dDwWsSnrtfvxuc0123456789")


def _foreign_escape(pattern: str) -> str | None:
    """The first letter escape (outside `\\\\`) xgrammar would misread, if any."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] == "\\":
            c = pattern[i + 1]
            if c.isalpha() and c not in _KNOWN_ESCAPES:
                return c
            i += 2
        else:
            i += 1
    return None


def _clean(e: Exception) -> str:
    """xgrammar's C++ errors, without the timestamp and source location."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _CPP_PREFIX.sub("", text).strip()


def choice_ebnf(choices: list[str]) -> str:
    # JSON string escapes are valid in xgrammar's EBNF string literals.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _json_options(p: StructuredOutputsParams) -> dict[str, Any]:
    return {
        "any_whitespace": p.any_whitespace,
        "max_whitespace_cnt": p.max_whitespace if p.any_whitespace else None,
    }


def _schema_text(p: StructuredOutputsParams) -> str:
    if p.json_object:
        return '{"type": "object"}'
    schema = load_schema(p.json)
    if not isinstance(schema, dict | bool):
        raise ValueError(
            f"a JSON schema must be an object (or true / false), got {type(schema).__name__}"
        )
    normalized = normalize_schema(inline_refs(schema))
    problems = _problems(schema, normalized)
    if problems and p.strict:
        raise ValueError(
            "the JSON schema uses features structured outputs cannot enforce (strict): "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        )
    if problems:  # the grammar takes the part it enforces; checks at run time do the rest
        broken = [p for p in unsupported_patterns(normalized) if _not_a_regex(p)]
        if broken:
            raise ValueError(f"the JSON schema has a pattern that is no regex: {broken[0]}")
        normalized = normalize_schema(relax(normalized, pattern_readable))
    return json.dumps(normalized)


def _problems(schema: Any, normalized: Any) -> list[str]:
    return unenforced(normalized) + overlapping_one_ofs(schema) + unsupported_patterns(normalized)


def _not_a_regex(problem: str) -> bool:
    """An unsupported_patterns entry for a pattern Python cannot compile either (a user's
    mistake, not a feature xgrammar lacks)."""
    m = re.match(r"pattern ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") at ", problem)
    if m is None:
        return False
    import regex

    try:
        compile_pattern(ast.literal_eval(m.group(1)))
    except (regex.error, ValueError, SyntaxError):
        return True
    return False


def pattern_readable(pattern: str) -> bool:
    """xgrammar reads `pattern` as JSON schema means it."""
    import xgrammar as xgr

    if _foreign_escape(pattern) is not None:
        return False
    try:
        xgr.Grammar.from_regex(pattern)
    except Exception:
        return False
    return True


def runtime_schema(p: StructuredOutputsParams) -> Any | None:
    """The user's schema when its grammar could not enforce all of it (not strict): values
    are then checked against it as they complete. None when the grammar says it all."""
    if p.kind != "json" or p.strict:
        return None
    schema = load_schema(p.json)
    if not isinstance(schema, dict):
        return None
    return schema if _problems(schema, normalize_schema(inline_refs(schema))) else None


def to_grammar(p: StructuredOutputsParams):
    """Parse and check without a tokenizer. Raises ValueError saying what is wrong."""
    import xgrammar as xgr

    p.verify()
    kind = p.kind
    if kind == "free":
        return None  # thinking bounds only: nothing to match after it
    try:
        if kind in ("json", "json_object"):
            text = _schema_text(p)
            try:
                return xgr.Grammar.from_json_schema(text, strict_mode=True, **_json_options(p))
            except RuntimeError:
                return xgr.Grammar.from_json_schema(text, strict_mode=False, **_json_options(p))
        if kind == "regex":
            return xgr.Grammar.from_regex(p.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(p.choice))
        if kind == "structural_tag":
            return xgr.Grammar.from_structural_tag(p.structural_tag)
        return _parse_grammar(p.grammar)
    except ValueError:
        raise
    except Exception as e:  # xgrammar raises RuntimeError from C++ with a useful text
        what = _KIND_NAMES[kind]
        raise ValueError(f"invalid {what}: {_clean(e)}") from None


def _parse_grammar(text: str):
    """EBNF first (`root ::= ...`); a grammar written in Lark (`start: ...`) also works."""
    import xgrammar as xgr

    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as ebnf_error:
        if "::=" in text:
            raise
        try:
            return xgr.Grammar.from_lark(text)
        except RuntimeError:
            raise ebnf_error from None


def cache_key(p: StructuredOutputsParams) -> str:
    """Equal keys compile to the same grammar."""
    kind = p.kind
    if kind == "free":
        return json.dumps([kind])
    value: Any = {
        "json": load_schema(p.json) if kind == "json" else None,
        "json_object": p.json_object,
        "regex": p.regex,
        "choice": p.choice,
        "grammar": p.grammar,
        "structural_tag": p.structural_tag,
    }[kind]
    ws = (p.any_whitespace, p.max_whitespace) if kind in ("json", "json_object") else None
    strict = p.strict if kind == "json" else None
    return json.dumps([kind, value, ws, strict], sort_keys=True, ensure_ascii=False)


def compile_grammar(compiler, p: StructuredOutputsParams):
    """A CompiledGrammar for `p` against the compiler's vocabulary (seconds at worst);
    None when there is nothing to match (kind "free")."""
    grammar = to_grammar(p)
    return None if grammar is None else compiler.compile_grammar(grammar)
