"""Real-world JSON schemas through structured outputs: which compile, which are refused and
why, and what xgrammar enforces of each keyword.

    .venv/bin/python benchmarks/structured_schema_sweep.py [--dir /tmp/schema-corpus]
        [--json benchmarks/results/structured_schema_sweep.json]

The corpus is the JSON schemas that PyPI packages ship (downloaded with `pip download
--no-deps`, unpacked, not installed): SchemaStore's CI and config schemas vendored by
check-jsonschema (GitHub workflows and actions, dependabot, renovate, readthedocs,
gitlab-ci, ...), the CloudFormation resource schemas of cfn-lint (AWS's API specs), the
JSON-schema metaschemas, the OpenAPI 2 / 3.x schemas, Jupyter's notebook format and
Vega-Lite's. Versions are pinned below so that runs compare.

For each schema: the keywords it uses (in schema positions only), and cadence's verdict
through `to_grammar` (the API's own check): accepted, refused (what could not be
enforced), or invalid (xgrammar cannot read it). Then each keyword probe of
tests/structured/keyword_probes.py: does raw xgrammar (strict and non-strict mode) reject
the violating text, and does cadence (its rewrites and refusals) leave any unenforced?
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "structured"))

PACKAGES = [
    "check-jsonschema==0.39.0",
    "cfn-lint==1.58.0",
    "jsonschema-specifications==2025.9.1",
    "openapi-spec-validator==0.9.0",
    "openapi-schema-validator==0.9.0",
    "nbformat==5.11.1",
    "altair==6.3.0",
]


def fetch(root: Path) -> list[tuple[str, dict]]:
    """(name, schema) of every JSON schema the packages ship; downloads once into root."""
    wheels = root / "wheels"
    if not wheels.exists() or not any(wheels.glob("*.whl")):
        wheels.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
        subprocess.run([*cmd, *PACKAGES], check=True)
    out = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for name in sorted(n for n in z.namelist() if n.endswith(".json")):
                if "/providers/" in name:  # cfn-lint's region -> schema maps, not schemas
                    continue
                try:
                    schema = json.loads(z.read(name))
                except ValueError:
                    continue
                if isinstance(schema, dict) and _looks_like_schema(schema):
                    out.append((f"{wheel.name.split('-')[0]}:{name}", schema))
    return out


def _looks_like_schema(d: dict) -> bool:
    keys = {"$schema", "type", "properties", "definitions", "$defs", "anyOf", "oneOf", "$ref"}
    return bool(keys & set(d))


def keywords(schema: dict) -> set[str]:
    from cadence.structured.schema_rules import subschemas

    return {k for _, s in subschemas(schema) for k in s}


def cadence_verdict(schema: dict) -> tuple[str, list[str]]:
    """('accepted' | 'refused' | 'invalid', reasons)."""
    from cadence.sampling_params import StructuredOutputsParams as S
    from cadence.structured.grammar import (
        normalize_schema,
        to_grammar,
        unsupported_features,
        unsupported_patterns,
    )
    from cadence.structured.schema_rules import inline_refs

    try:
        to_grammar(S(json=schema))
        return "accepted", []
    except ValueError as e:
        text = str(e)
    if "cannot enforce" not in text:
        return "invalid", [re.sub(r"\d+", "N", text.split(":")[-1].strip())[:70]]
    reasons = [p.split(" (")[0] for p in unsupported_features(schema)]
    normalized = normalize_schema(inline_refs(schema))
    reasons += [
        "pattern: "
        + re.sub(r"Regex parsing error at position \d+: ", "", p.split(": ", 1)[-1])[:50]
        for p in unsupported_patterns(normalized)
    ]
    return "refused", sorted(set(reasons))


def _matcher_accepts(grammar, text: str) -> bool:
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(
        compiler.compile_grammar(grammar), terminate_without_stop_token=True
    )
    return matcher.accept_string(text) and matcher.is_terminated()


def raw_verdict(schema: dict, bad: str, good: str, strict: bool) -> str:
    """What xgrammar alone does with the keyword: enforced / IGNORED / over-restricts."""
    import xgrammar as xgr

    try:
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=strict)
    except RuntimeError:
        return "error"
    if _matcher_accepts(grammar, bad):
        return "IGNORED"
    return "enforced" if _matcher_accepts(grammar, good) else "over-restricts"


def cadence_probe(schema: dict, bad: str) -> str:
    """'refused', 'enforced' (the violating text is rejected) or 'UNENFORCED' (a bug)."""
    from cadence.sampling_params import StructuredOutputsParams as S
    from cadence.structured.grammar import to_grammar

    try:
        grammar = to_grammar(S(json=schema))
    except ValueError:
        return "refused"
    return "UNENFORCED" if _matcher_accepts(grammar, bad) else "enforced"


def probe_is_sound(schema: dict, bad: str, good: str) -> str:
    """Does `jsonschema` agree that `bad` violates and `good` satisfies the schema?"""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        good_ok, bad_ok = v.is_valid(json.loads(good)), v.is_valid(json.loads(bad))
    except jsonschema.exceptions.SchemaError as e:
        return f"schema invalid: {e.message[:40]}"
    except Exception as e:  # an external $ref, with no network here
        return f"cannot check: {type(e).__name__}"
    if good_ok and not bad_ok:
        return "yes"
    if "format" in schema and bad_ok:
        return "format not checked by the installed jsonschema"
    return f"NO (bad valid: {bad_ok}, good valid: {good_ok})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/cadence-schema-corpus")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()

    from keyword_probes import PROBES

    t0 = time.perf_counter()
    corpus = fetch(Path(args.dir))
    sources = collections.Counter(name.split(":")[0] for name, _ in corpus)
    verdicts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    used: collections.Counter[str] = collections.Counter()
    by_source: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    sole: collections.Counter[str] = collections.Counter()  # refused for this reason alone
    for name, schema in corpus:
        used.update(keywords(schema))
        verdict, why = cadence_verdict(schema)
        verdicts[verdict] += 1
        by_source[name.split(":")[0]][verdict] += 1
        reasons.update(f"{verdict}: {r}" for r in why)
        if verdict == "refused" and len(why) == 1:
            sole[why[0]] += 1
    probes = []
    for name, schema, bad, good in PROBES:
        probes.append(
            {
                "probe": name,
                "xgrammar_strict": raw_verdict(schema, bad, good, strict=True),
                "xgrammar_loose": raw_verdict(schema, bad, good, strict=False),
                "cadence": cadence_probe(schema, bad),
                "probe_sound": probe_is_sound(schema, bad, good),
            }
        )
    summary = {
        "packages": PACKAGES,
        "schemas": len(corpus),
        "by_source": dict(sources),
        "verdicts": dict(verdicts),
        "verdicts_by_source": {k: dict(v) for k, v in sorted(by_source.items())},
        "reasons": dict(reasons.most_common()),
        "sole_reason": dict(sole.most_common()),
        "keywords_used": dict(used.most_common()),
        "probes": probes,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(f"{len(corpus)} schemas: {dict(sources)}")
    print(f"cadence: {dict(verdicts)}")
    for source, counts in sorted(by_source.items()):
        print(f"  {source}: {dict(counts)}")
    print(f"refused for one reason alone: {dict(sole.most_common(6))}")
    print("top reasons (schemas):")
    for reason, n in reasons.most_common(25):
        print(f"  {n:5d}  {reason}")
    print(f"\n{'probe':40s} {'xgr strict':14s} {'xgr loose':14s} {'cadence':11s} probe sound")
    for p in probes:
        print(
            f"{p['probe']:40s} {p['xgrammar_strict']:14s} {p['xgrammar_loose']:14s} "
            f"{p['cadence']:11s} {p['probe_sound']}"
        )
    print(f"\n{summary['seconds']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
