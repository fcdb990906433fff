"""The arithmetic of `cadence bench serve`: per-request records to per-run figures.

Per request (seconds): TTFT, send to the first chunk carrying text; ITL, each gap between
successive chunks carrying text; end-to-end, send to the end of the stream; TPOT,
(e2e - TTFT) / (output tokens - 1), for requests of two or more output tokens.

Per run (milliseconds, as vLLM's `bench serve` reports them, and under its JSON keys):
mean / median / p90 / p99 / std of TTFT, TPOT and ITL (ITL pools every gap of every
request), mean / median / p90 / p99 of end-to-end latency; throughput per second of the
run's duration (first send to last response); goodput, the requests per second that meet
every SLO given.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

# SLO names: the TTFT, TPOT and end-to-end latency limits, in milliseconds.
SLO_KEYS = ("ttft", "tpot", "e2el")
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds; `start` counts from the run's
    start. Token counts come from the server's usage (or the tokenizer, if it sent none)."""

    index: int
    max_tokens: int | None = None
    start: float = 0.0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    usage_source: str | None = None  # "server", "tokenizer" or None (unknown)
    tokenizer_prompt_tokens: int | None = None
    tokenizer_output_tokens: int | None = None
    success: bool = False
    error: str = ""
    generated_text: str = ""
    group: int | None = None

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first; None below two tokens."""
        if self.ttft is None or self.e2e is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """The record with units in its keys (`_s`: seconds)."""
        d = asdict(self)
        out: dict[str, Any] = {
            "index": d["index"],
            "success": d["success"],
            "error": d["error"],
            "start_s": d["start"],
            "ttft_s": d["ttft"],
            "tpot_s": self.tpot,
            "e2e_s": d["e2e"],
            "itl_s": d["itls"],
            "prompt_tokens": d["prompt_tokens"],
            "output_tokens": d["output_tokens"],
            "max_tokens": d["max_tokens"],
            "usage_source": d["usage_source"],
            "tokenizer_prompt_tokens": d["tokenizer_prompt_tokens"],
            "tokenizer_output_tokens": d["tokenizer_output_tokens"],
            "generated_text": d["generated_text"],
        }
        if self.group is not None:
            out["group"] = self.group
        return out


# ---- arithmetic -----------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile, interpolated linearly (numpy's default); None if empty."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def distribution_ms(values_s: list[float], name: str) -> dict[str, float | None]:
    """mean / median / std / p90 / p99 of seconds, in milliseconds, under vLLM's keys."""
    ms = [v * 1e3 for v in values_s]
    out: dict[str, float | None] = {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else None,
        f"median_{name}_ms": percentile(ms, 50),
        f"std_{name}_ms": statistics.pstdev(ms) if ms else None,
    }
    for p in PERCENTILES:
        if p != 50:
            out[f"p{p}_{name}_ms"] = percentile(ms, p)
    return out


def meets_slo(record: RequestRecord, slo_ms: dict[str, float]) -> bool:
    """Whether a successful request is within every limit in `slo_ms` (milliseconds).
    A one-token request has no TPOT, and so meets any TPOT limit."""
    if not record.success:
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2e}
    for key, limit in slo_ms.items():
        v = values[key]
        if v is None:
            if key == "tpot":
                continue
            return False
        if v * 1e3 > limit:
            return False
    return True


def summarize(
    records: list[RequestRecord], duration: float, slo_ms: dict[str, float] | None = None
) -> dict[str, Any]:
    """One run's figures. `duration` is seconds; latencies come out in milliseconds,
    throughputs per second. Failed requests count only in `failed`."""
    ok = [r for r in records if r.success]
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(prompt_tokens + output_tokens),
    }
    if slo_ms:
        good = sum(1 for r in ok if meets_slo(r, slo_ms))
        out["good_requests"] = good
        out["request_goodput"] = per_s(good)
    else:
        out["good_requests"] = None
        out["request_goodput"] = None
    out.update(distribution_ms([r.ttft for r in ok if r.ttft is not None], "ttft"))
    tpots = [t for r in ok if (t := r.tpot) is not None]
    out.update(distribution_ms(tpots, "tpot"))
    out.update(distribution_ms([g for r in ok for g in r.itls], "itl"))
    out.update(distribution_ms([r.e2e for r in ok if r.e2e is not None], "e2el"))
    return out


def token_check(records: list[RequestRecord], ignore_eos: bool) -> dict[str, Any]:
    """The server's token counts against the tokenizer's, over successful requests.

    Prompt counts should agree exactly when client and server share a tokenizer; output
    counts of re-encoded text need not (decoding is not always reversible). With
    `ignore_eos`, every request should have generated its max_tokens.
    """
    ok = [r for r in records if r.success]
    with_usage = [r for r in ok if r.usage_source == "server"]
    both_p = [r for r in with_usage if r.tokenizer_prompt_tokens is not None]
    both_o = [r for r in with_usage if r.tokenizer_output_tokens is not None]
    out: dict[str, Any] = {
        "requests_without_usage": len(ok) - len(with_usage),
        "prompt_tokens_server": sum(r.prompt_tokens or 0 for r in both_p),
        "prompt_tokens_tokenizer": sum(r.tokenizer_prompt_tokens or 0 for r in both_p),
        "prompt_mismatches": sum(1 for r in both_p if r.prompt_tokens != r.tokenizer_prompt_tokens),
        "output_tokens_server": sum(r.output_tokens or 0 for r in both_o),
        "output_tokens_tokenizer": sum(r.tokenizer_output_tokens or 0 for r in both_o),
        "output_mismatches": sum(1 for r in both_o if r.output_tokens != r.tokenizer_output_tokens),
        "checked_requests": len(both_p),
    }
    if ignore_eos:
        out["short_outputs"] = sum(
            1
            for r in ok
            if r.max_tokens is not None
            and r.output_tokens is not None
            and r.output_tokens != r.max_tokens
        )
    return out


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=500,tpot=50,e2el=2000` (milliseconds; also `ttft:500`) -> {name: ms}."""
    slo: dict[str, float] = {}
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        sep = "=" if "=" in item else ":"
        key, _, value = item.partition(sep)
        key = key.strip().lower()
        if key not in SLO_KEYS or not value:
            raise ValueError(
                f"bad SLO {item!r}: want NAME=MILLISECONDS with NAME one of {', '.join(SLO_KEYS)}"
            )
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"bad SLO {item!r}: {value!r} is not a number") from None
        if not limit > 0 or math.isinf(limit):
            raise ValueError(f"bad SLO {item!r}: the limit must be a positive number of ms")
        slo[key] = limit
    if not slo:
        raise ValueError("empty SLO: want e.g. ttft=500,tpot=50")
    return slo


__all__ = [
    "PERCENTILES",
    "SLO_KEYS",
    "RequestRecord",
    "distribution_ms",
    "meets_slo",
    "parse_slo",
    "percentile",
    "summarize",
    "token_check",
]
