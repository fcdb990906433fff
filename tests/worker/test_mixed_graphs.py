"""The token buckets of the prefill/mixed-step CUDA graphs (the graphs themselves are tested
on the GPU machine, tests/worker/test_cuda_runner.py)."""

from __future__ import annotations

from cadence.worker.mixed_graphs import BUCKETS, largest_bucket


def test_a_step_past_512_tokens_fills_two_thirds_of_its_bucket():
    for tokens in range(513, BUCKETS[-1] + 1):
        bucket = min(b for b in BUCKETS if b >= tokens)
        assert 3 * tokens >= 2 * bucket, (tokens, bucket)


def test_the_largest_bucket_is_the_budget_when_it_fits():
    assert largest_bucket(24) == 24
    assert largest_bucket(BUCKETS[-1]) == BUCKETS[-1]
    assert largest_bucket(8192) == BUCKETS[-1] == 2048
