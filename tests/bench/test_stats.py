"""The metric arithmetic of `cadence bench serve` on hand-made records (exact figures)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from cadence.bench.serve import arrival_delays
from cadence.bench.stats import (
    RequestRecord,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
    token_check,
)


def rec(i, ttft, itls, e2e, prompt, out, ok=True, **kw) -> RequestRecord:
    return RequestRecord(
        index=i,
        ttft=ttft,
        itls=list(itls),
        e2e=e2e,
        prompt_tokens=prompt,
        output_tokens=out,
        success=ok,
        error="" if ok else "boom",
        usage_source="server",
        **kw,
    )


RECORDS = [
    rec(0, 0.1, [0.05, 0.05, 0.05], 0.25, 10, 4),
    rec(1, 0.3, [0.1], 0.4, 20, 2),
    rec(2, 0.9, [], 1.0, 99, 9, ok=False),  # failed: counted only as failed
]


@pytest.mark.parametrize("p", [0, 10, 50, 90, 99, 100])
def test_percentile_interpolates_like_numpy(p):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert percentile([], p) is None
    assert percentile([7.0], p) == 7.0


def test_summary_figures_are_exact():
    s = summarize(RECORDS, duration=2.0)
    assert (s["completed"], s["failed"]) == (2, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (30, 6)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(3.0)
    assert s["total_token_throughput"] == pytest.approx(18.0)
    # TTFT: 100 and 300 ms
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(100 + 200 * 0.99)
    assert s["std_ttft_ms"] == pytest.approx(100.0)
    # TPOT: (250-100)/3 = 50 ms and (400-300)/1 = 100 ms
    assert s["mean_tpot_ms"] == pytest.approx(75.0)
    assert s["p90_tpot_ms"] == pytest.approx(95.0)
    # ITL pools every gap: 50, 50, 50, 100 ms
    assert s["mean_itl_ms"] == pytest.approx(62.5)
    assert s["median_itl_ms"] == pytest.approx(50.0)
    assert s["p99_itl_ms"] == pytest.approx(float(np.percentile([50, 50, 50, 100], 99)))
    # end-to-end: 250 and 400 ms
    assert s["mean_e2el_ms"] == pytest.approx(325.0)
    assert s["p99_e2el_ms"] == pytest.approx(250 + 150 * 0.99)
    assert s["request_goodput"] is None and s["good_requests"] is None


@pytest.mark.parametrize(
    "slo, good",
    [
        ({"ttft": 200}, 1),
        ({"ttft": 300}, 2),  # limits are inclusive
        ({"tpot": 60}, 1),
        ({"e2el": 300}, 1),
        ({"ttft": 1000, "tpot": 1000, "e2el": 1000}, 2),
        ({"ttft": 50}, 0),
    ],
)
def test_goodput_counts_requests_within_every_slo(slo, good):
    s = summarize(RECORDS, duration=2.0, slo_ms=slo)
    assert s["good_requests"] == good
    assert s["request_goodput"] == pytest.approx(good / 2.0)


def test_one_token_request_has_no_tpot():
    r = rec(0, 0.2, [], 0.2, 5, 1)
    assert r.tpot is None
    assert meets_slo(r, {"tpot": 1.0})  # nothing to miss
    assert not meets_slo(r, {"ttft": 100})
    s = summarize([r], duration=1.0)
    assert s["mean_tpot_ms"] is None and s["mean_itl_ms"] is None
    assert s["mean_ttft_ms"] == pytest.approx(200.0)


def test_empty_run():
    s = summarize([], duration=0.0)
    assert s["completed"] == 0 and s["request_throughput"] == 0.0 and s["mean_ttft_ms"] is None


def test_token_check():
    a = rec(0, 0.1, [], 0.2, 10, 4, tokenizer_prompt_tokens=10, tokenizer_output_tokens=4)
    a.max_tokens = 4
    b = rec(1, 0.1, [], 0.2, 12, 3, tokenizer_prompt_tokens=11, tokenizer_output_tokens=3)
    b.max_tokens = 4
    c = rec(2, 0.1, [], 0.2, 7, 4, tokenizer_prompt_tokens=7, tokenizer_output_tokens=5)
    c.usage_source = "tokenizer"
    check = token_check([a, b, c], ignore_eos=True)
    assert check["requests_without_usage"] == 1
    assert check["checked_requests"] == 2
    assert (check["prompt_tokens_server"], check["prompt_tokens_tokenizer"]) == (22, 21)
    assert check["prompt_mismatches"] == 1
    assert check["output_mismatches"] == 0
    assert check["short_outputs"] == 1
    assert "short_outputs" not in token_check([a], ignore_eos=False)


def test_parse_slo():
    assert parse_slo("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo("ttft:500 e2el:2000") == {"ttft": 500.0, "e2el": 2000.0}
    for bad, words in [
        ("ttft", "NAME=MILLISECONDS"),
        ("foo=3", "one of ttft, tpot, e2el"),
        ("ttft=abc", "not a number"),
        ("tpot=-1", "positive"),
        ("", "empty"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_slo(bad)


def test_arrival_delays():
    assert arrival_delays(5, float("inf"), 1.0, 0) == [0.0] * 5
    d = arrival_delays(4001, 10.0, 1.0, seed=3)
    assert d[0] == 0.0 and d == arrival_delays(4001, 10.0, 1.0, seed=3)
    gaps = d[1:]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.06)
    # Poisson: gaps exponential, coefficient of variation 1; burstiness 0.25: CV 2
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.1)
    bursty = arrival_delays(4001, 10.0, 0.25, seed=3)[1:]
    assert statistics.fmean(bursty) == pytest.approx(0.1, rel=0.15)
    assert statistics.pstdev(bursty) / statistics.fmean(bursty) == pytest.approx(2.0, rel=0.15)
