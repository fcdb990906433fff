"""`cadence bench serve` reports a run's speculative-decoding acceptance from the server's
counters (Cadence's or vLLM's names), and nothing for a server that drafts nothing."""

from __future__ import annotations

import pytest

from cadence.bench import report
from cadence.bench.spec_metrics import parse, run_delta

BEFORE = """
# HELP cadence:spec_decode_num_drafts_total Speculative decoding: verifications
cadence:spec_decode_num_drafts_total{model_name="m"} 10.0
cadence:spec_decode_num_draft_tokens_total{model_name="m"} 40.0
cadence:spec_decode_num_accepted_tokens_total{model_name="m"} 20.0
cadence:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 8.0
cadence:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 6.0
cadence:num_requests_running{model_name="m"} 1.0
"""
AFTER_VLLM = """
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 110.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 440.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 320.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 88.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 66.0
"""


def test_a_runs_acceptance_is_the_difference_of_the_counters():
    spec = run_delta(parse(BEFORE), parse(AFTER_VLLM))
    assert spec["drafts"] == 100 and spec["draft_tokens"] == 400
    assert spec["accepted_tokens"] == 300
    assert spec["acceptance_rate"] == pytest.approx(0.75)
    assert spec["acceptance_length"] == pytest.approx(4.0)  # (300 + 100) / 100
    assert spec["acceptance_rate_per_position"] == pytest.approx([0.8, 0.6])
    text = report.format_run({**_run(), "spec_decode": spec})
    assert "Speculative Decoding" in text and "Acceptance length:" in text
    assert "80.0, 60.0" in text


def test_no_section_without_drafts_or_counters():
    assert run_delta(parse(BEFORE), parse(BEFORE)) is None
    assert run_delta(parse("up 1\n"), parse("up 1\n")) is None
    assert run_delta(None, parse(BEFORE)) is None
    assert "Speculative" not in report.format_run(_run())


def _run() -> dict:
    keys = ("ttft", "tpot", "itl", "e2el")
    summary = {f"{s}_{k}_ms": 1.0 for k in keys for s in ("mean", "median", "p90", "p99")}
    summary.update(
        completed=1,
        failed=0,
        duration=1.0,
        total_input_tokens=1,
        total_output_tokens=1,
        request_throughput=1.0,
        output_throughput=1.0,
        total_token_throughput=2.0,
    )
    return {"summary": summary, "max_concurrency": 1, "request_rate": None}
