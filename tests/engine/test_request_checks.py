"""The checks a request meets before the core queues it (no model needed)."""

from __future__ import annotations

import pytest

from cadence.engine.request_checks import RequestChecks
from cadence.sampling_params import SamplingParams

CHECKS = RequestChecks(max_model_len=16, vocab_size=100, prefill_addrs=None)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "the prompt is empty"),
        (list(range(16)), "the prompt has 16 tokens; this model's context holds 16"),
        ([1, 100], "prompt token id 100 is outside the vocabulary [0, 100)"),
        ([1, -1], "prompt token id -1 is outside"),
    ],
)
def test_a_prompt_the_model_cannot_take_is_refused_saying_why(prompt, message):
    with pytest.raises(ValueError) as info:
        CHECKS.check(prompt, SamplingParams())
    assert message in str(info.value)


def test_max_tokens_defaults_to_what_the_context_leaves():
    params = SamplingParams(max_tokens=None)
    CHECKS.check([1, 2, 3], params)
    assert params.max_tokens == 13
    given = SamplingParams(max_tokens=4)
    CHECKS.check([1, 2, 3], given)
    assert given.max_tokens == 4


def test_a_prefill_engine_outside_the_allowed_list_is_refused():
    checks = RequestChecks(16, 100, frozenset({"tcp://10.0.0.1:7000"}))
    params = SamplingParams(
        kv_transfer_params={
            "do_remote_prefill": True,
            "remote_addr": "tcp://10.0.0.2:7000",
            "transfer_id": "abc",
        }
    )
    with pytest.raises(ValueError, match="not one of this engine's prefill engines"):
        checks.check([1, 2, 3], params)
    params.kv_transfer_params["remote_addr"] = "tcp://10.0.0.1:7000"
    checks.check([1, 2, 3], params)  # the listed one passes
