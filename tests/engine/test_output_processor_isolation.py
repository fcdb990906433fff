"""One bad update in an engine message fails its own request only: the message's other
updates are applied, the failed request's samples end with finish_reason "error" and are
returned as ids to stop in the core, and `take_failed()` names it with the error."""

from __future__ import annotations

import time

import pytest

from cadence.core.scheduler_output import RequestUpdate
from cadence.engine.output_processor import OutputProcessor
from cadence.sampling_params import SamplingParams

POISON = 666  # the stub tokenizer cannot decode this token


class StubTokenizer:
    """Decodes token t as chr(ord('a') + t % 26); raises on POISON."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if POISON in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "stub: undecodable token")
        return "".join(chr(ord("a") + t % 26) for t in ids)


@pytest.fixture
def processor() -> OutputProcessor:
    proc = OutputProcessor(StubTokenizer())
    for rid in ("a", "b", "c"):
        proc.add_request(rid, None, [1, 2], SamplingParams(max_tokens=8), time.time())
    return proc


def test_a_failing_update_does_not_drop_the_rest_of_the_message(processor):
    changed, to_stop = processor.process(
        [RequestUpdate("a", [0]), RequestUpdate("b", [POISON]), RequestUpdate("c", [2])]
    )
    states = {s.request_id: s for s in changed}
    assert states["a"].samples[0].output.text == "a"
    assert states["c"].samples[0].output.text == "c"
    failed = processor.take_failed()
    assert [rid for rid, _ in failed] == ["b"]
    assert "undecodable" in failed[0][1]
    assert processor.take_failed() == []  # handed over once
    b = states["b"]  # the handler is woken, sees the error and a finished request
    assert b.error == failed[0][1]
    assert b.finished and b.samples[0].output.finish_reason == "error"
    assert to_stop == ["b"]  # the core must stop generating for it
    assert "b" not in processor.requests


def test_the_others_keep_streaming_and_the_failed_one_is_ignored(processor):
    processor.process([RequestUpdate("a", [0]), RequestUpdate("b", [POISON])])
    processor.take_failed()
    # The core may still send for "b" before the stop reaches it.
    changed, to_stop = processor.process(
        [RequestUpdate("b", [3]), RequestUpdate("a", [1], finish_reason="length")]
    )
    assert [s.request_id for s in changed] == ["a"]
    assert to_stop == [] and processor.take_failed() == []
    assert changed[0].samples[0].output.text == "ab" and changed[0].finished


def test_every_sample_of_a_failed_request_is_stopped():
    proc = OutputProcessor(StubTokenizer())
    ids = proc.add_request("r", None, [1], SamplingParams(n=3, max_tokens=8), time.time())
    proc.process([RequestUpdate(ids[0], [4], finish_reason="length")])  # sample 0 done
    changed, to_stop = proc.process([RequestUpdate(ids[1], [POISON])])
    assert to_stop == ids[1:]  # the failing sample and its unfinished sibling
    outputs = changed[0].samples
    assert [o.output.finish_reason for o in outputs] == ["length", "error", "error"]
    assert [rid for rid, _ in proc.take_failed()] == ["r"]


def test_a_malformed_prompt_logprobs_list_fails_its_request_only():
    proc = OutputProcessor(StubTokenizer())
    now = time.time()
    proc.add_request("x", None, [1, 2], SamplingParams(prompt_logprobs=1), now)
    proc.add_request("y", None, [1, 2], SamplingParams(prompt_logprobs=1), now)
    good = [None, (-0.5, [(9, -0.1)])]
    changed, _ = proc.process(
        [
            RequestUpdate("x", [0], new_prompt_logprobs=[*good, (-1.0, [])]),  # 3 for 2
            RequestUpdate("y", [0], new_prompt_logprobs=good),
        ]
    )
    states = {s.request_id: s for s in changed}
    assert states["x"].error is not None
    assert states["y"].error is None
    assert states["y"].prompt_logprobs == [None, {9: -0.1, 2: -0.5}]
