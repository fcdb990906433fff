"""Speculative decoding's acceptance during a benchmark run, from the server's /metrics.

The server's counters are read before and after a run; the differences give the run's
drafts (verifications), draft tokens, accepted tokens and acceptance per draft position.
Cadence's names (`cadence:spec_decode_*`) and vLLM's (`vllm:spec_decode_*`) are the same
after the prefix. A server without them, or without a reachable /metrics, gives None: the
report then has no speculative-decoding section.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

_PREFIXES = ("cadence:", "vllm:")
_COUNTERS = {
    "spec_decode_num_drafts": "drafts",
    "spec_decode_num_draft_tokens": "draft_tokens",
    "spec_decode_num_accepted_tokens": "accepted_tokens",
}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos"
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def parse(text: str) -> dict[str, Any]:
    """Totals of the speculative-decoding counters in a Prometheus text page (summed over
    label sets, e.g. several models), with accepted tokens per position."""
    totals: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        for prefix in _PREFIXES:
            if not name.startswith(prefix):
                continue
            base = name[len(prefix) :].removesuffix("_total")
            if base in _COUNTERS:
                key = _COUNTERS[base]
                totals[key] = totals.get(key, 0.0) + value
            elif base == _PER_POS:
                pos = re.search(r'position="(\d+)"', labels)
                if pos is not None:
                    i = int(pos.group(1))
                    per_pos[i] = per_pos.get(i, 0.0) + value
    if per_pos:
        totals["accepted_per_position"] = per_pos
    return totals


async def scrape(client: httpx.AsyncClient) -> dict[str, Any] | None:
    import httpx

    try:
        response = await client.get("/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse(response.text)


def run_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict | None:
    """The run's acceptance (None if the server drafted nothing or reports no counters)."""
    if not before or not after:
        return None
    d = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in _COUNTERS.values()}
    if d["drafts"] <= 0 or d["draft_tokens"] <= 0:
        return None
    out: dict[str, Any] = {key: int(v) for key, v in d.items()}
    out["acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"]
    out["acceptance_length"] = (d["accepted_tokens"] + d["drafts"]) / d["drafts"]
    pos_before = before.get("accepted_per_position", {})
    pos_after = after.get("accepted_per_position", {})
    out["acceptance_rate_per_position"] = [
        (pos_after[i] - pos_before.get(i, 0.0)) / d["drafts"] for i in sorted(pos_after)
    ]
    return out
