"""The server's metrics: what the output processor reports once per engine message adds up
to what one report per token would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from cadence.metrics import ServerMetrics, observe_times


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("value", [0.0, 0.0005, 0.01, 0.0101, 3.0, 1e6])
@pytest.mark.parametrize("times", [1, 2, 37])
def test_observe_times_equals_repeated_observations(value, times):
    one, many = CollectorRegistry(), CollectorRegistry()
    buckets = (0.001, 0.01, 0.1, 1.0, 10.0)
    a = Histogram("gap_seconds", "a", buckets=buckets, registry=one)
    b = Histogram("gap_seconds", "b", buckets=buckets, registry=many)
    for _ in range(times):
        a.observe(value)
    observe_times(b, value, times)
    assert _samples(many) == pytest.approx(_samples(one))


def test_on_tokens_counts_every_token_and_every_gap():
    m = ServerMetrics("tiny")
    gaps = [0.012, 0.012, 0.012, 0.5, 0.012]
    m.on_tokens(7, gaps)
    m.on_tokens(1, [])
    got = m.samples()
    assert got["cadence:generation_tokens_total"] == 8
    assert got["cadence:inter_token_latency_seconds_count"] == 5
    assert got["cadence:inter_token_latency_seconds_sum"] == pytest.approx(sum(gaps))
    le_20ms = 'cadence:inter_token_latency_seconds_bucket{le="0.02"}'
    le_10ms = 'cadence:inter_token_latency_seconds_bucket{le="0.01"}'
    assert got[le_20ms] == 4
    assert got[le_10ms] == 0
