"""Real-world JSON schemas through structured outputs: which compile, which are refused and
why, and what xgrammar enforces of each keyword.

    .venv/bin/python benchmarks/structured_schema_sweep.py [--dir /tmp/schema-corpus]
        [--json benchmarks/results/structured_schema_sweep.json] [--generate-every K]

The corpus is the JSON schemas that PyPI packages ship (downloaded with `pip download
--no-deps`, unpacked, not installed): SchemaStore's CI and config schemas vendored by
check-jsonschema (GitHub workflows and actions, dependabot, renovate, readthedocs,
gitlab-ci, ...), the CloudFormation resource schemas of cfn-lint (AWS's API specs), the
JSON-schema metaschemas, the OpenAPI 2 / 3.x schemas, Jupyter's notebook format and
Vega-Lite's. Versions are pinned below so that runs compare.

For each schema: the keywords it uses (in schema positions only), and cadence's verdict
through `to_grammar` (the API's own check): accepted (the grammar enforces it all),
checked (the grammar enforces a wider schema, run-time checks the rest:
structured/checked.py), refused (only with `strict: true`: what no grammar enforces), or
invalid (xgrammar cannot read it). Then each keyword probe of
tests/structured/keyword_probes.py: does raw xgrammar (strict and non-strict mode) reject
the violating text, and does cadence leave any unenforced? With --generate-every K, every
K-th accepted or checked schema is generated for on the default model (greedy, 256 tokens)
and each output judged by `jsonschema`: a VIOLATION is an output that finished with `stop`
and fails its schema (there must be none).
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


def cadence_verdict(schema: dict, strict: bool) -> tuple[str, list[str]]:
    """('accepted' | 'checked' | 'refused' | 'invalid', reasons): accepted, the grammar
    enforces it all; checked, accepted with run-time checks for the rest (not strict)."""
    from cadence.sampling_params import StructuredOutputsParams as S
    from cadence.structured.grammar import runtime_schema, to_grammar

    try:
        to_grammar(S(json=schema, strict=strict))
    except ValueError as e:
        text = str(e)
        if "cannot enforce" not in text:
            return "invalid", [re.sub(r"\d+", "N", text.split(":")[-1].strip())[:70]]
        return "refused", _reasons(schema)
    if runtime_schema(S(json=schema, strict=strict)) is not None:
        return "checked", _reasons(schema)
    return "accepted", []


def _reasons(schema: dict) -> list[str]:
    """What no grammar enforces in `schema`, by kind."""
    from cadence.structured.grammar import (
        normalize_schema,
        unsupported_features,
        unsupported_patterns,
    )
    from cadence.structured.schema_rules import inline_refs

    reasons = [p.split(" (")[0] for p in unsupported_features(schema)]
    normalized = normalize_schema(inline_refs(schema))
    reasons += [
        "pattern: "
        + re.sub(r"Regex parsing error at position \d+: ", "", p.split(": ", 1)[-1])[:50]
        for p in unsupported_patterns(normalized)
    ]
    return sorted(set(reasons))


def generate(corpus: list[tuple[str, dict]], verdicts: dict[str, str], every: int) -> dict:
    """Every `every`-th schema that is accepted or checked, generated for on the default
    model (greedy, 256 tokens at most); each output judged by `jsonschema`."""

    from cadence import LLM, SamplingParams
    from cadence.sampling_params import StructuredOutputsParams as S

    chosen = [(n, s) for n, s in corpus if verdicts[n] in ("accepted", "checked")][::every]
    llm = LLM(kv_cache_memory=512 * 2**20)
    prompts = [
        [{"role": "user", "content": f"Write one JSON instance of the schema {n.split('/')[-1]}."}]
        for n, _ in chosen
    ]
    params = [
        SamplingParams(temperature=0, max_tokens=256, structured_outputs=S(json=s))
        for _, s in chosen
    ]
    t0 = time.perf_counter()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for at in range(0, len(chosen), 8):  # in batches; a batch with a failure, one by one
        part = range(at, min(at + 8, len(chosen)))
        try:
            outs = llm.chat([prompts[i] for i in part], [params[i] for i in part], use_tqdm=False)
        except ValueError:
            outs = []
            for i in part:
                try:
                    outs += llm.chat([prompts[i]], [params[i]], use_tqdm=False)
                except ValueError as e:  # a grammar past --grammar-compile-timeout
                    outs.append(str(e))
        for i, out in zip(part, outs, strict=True):
            name, schema = chosen[i]
            if isinstance(out, str):
                verdict = "compile timeout" if "did not compile" in out else "failed"
            elif out.outputs[0].finish_reason == "stop":
                verdict = _judge(schema, out.outputs[0].text)
            else:
                verdict = out.outputs[0].finish_reason
            counts[verdicts[name]][verdict] += 1
    seconds = time.perf_counter() - t0
    return {
        "every": every,
        "schemas": len(chosen),
        "seconds": round(seconds, 1),
        "outputs": {k: dict(v) for k, v in counts.items()},
    }


def _judge(schema: dict, text: str) -> str:
    """'valid', 'VIOLATION' (finished with stop, fails the schema) or 'unchecked'."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        valid = cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(text))
    except ValueError:
        return "VIOLATION"  # not JSON at all
    except Exception:  # a pattern `re` cannot read, an external $ref
        return "unchecked"
    return "valid" if valid else "VIOLATION"


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
    """'refused' (strict), 'enforced' (the grammar rejects the violating text), 'checked'
    (run-time checks do: tests/structured/test_checked.py) or 'UNENFORCED' (a bug)."""
    from cadence.sampling_params import StructuredOutputsParams as S
    from cadence.structured.grammar import runtime_schema, to_grammar

    try:
        grammar = to_grammar(S(json=schema))
    except ValueError:
        return "refused"
    if not _matcher_accepts(grammar, bad):
        return "enforced"
    return "checked" if runtime_schema(S(json=schema)) is not None else "UNENFORCED"


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
    ap.add_argument(
        "--generate-every",
        type=int,
        default=0,
        metavar="K",
        help="generate on the default model for every K-th accepted schema (0: none)",
    )
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
    strict: collections.Counter[str] = collections.Counter()  # what strict: true says
    each: dict[str, str] = {}
    for name, schema in corpus:
        used.update(keywords(schema))
        strict[cadence_verdict(schema, strict=True)[0]] += 1
        verdict, why = cadence_verdict(schema, strict=False)
        each[name] = verdict
        verdicts[verdict] += 1
        by_source[name.split(":")[0]][verdict] += 1
        reasons.update(f"{verdict}: {r}" for r in why)
        if verdict in ("refused", "checked") and len(why) == 1:
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
        "verdicts_strict": dict(strict),
        "verdicts_by_source": {k: dict(v) for k, v in sorted(by_source.items())},
        "reasons": dict(reasons.most_common()),
        "sole_reason": dict(sole.most_common()),  # (checked or refused for it alone)
        "keywords_used": dict(used.most_common()),
        "probes": probes,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(f"{len(corpus)} schemas: {dict(sources)}")
    print(f"cadence: {dict(verdicts)} (strict: true: {dict(strict)})")
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
    if args.generate_every:
        summary["generation"] = generate(corpus, each, args.generate_every)
        print(f"\ngenerated: {summary['generation']}")
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"\n{summary['seconds']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
