"""The step messages between rank 0 and the other ranks: every SchedulerOutput field but the
core's Request objects travels, in order, through msgspec; a frame that is not a list of
ops (a pickle, junk, a wrong field type) is a ValueError, never code that runs."""

from __future__ import annotations

import dataclasses
import pickle

import msgspec
import pytest

from cadence.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from cadence.executor import step_messages as M
from cadence.sampling_params import SamplingParams


def test_every_field_but_requests_travels():
    fields = [f.name for f in dataclasses.fields(SchedulerOutput) if f.name != "requests"]
    assert list(M.WIRE_FIELDS) == fields


def test_a_step_round_trips_in_batch_order():
    params = SamplingParams(
        temperature=0.7,
        seed=3,
        logit_bias={5: -2.0},
        stop=["x"],
        structured_outputs={"json": {"type": "object"}},
        kv_transfer_params={"do_remote_decode": True, "transfer_id": "t"},
    )
    sched = SchedulerOutput(
        new_requests=[NewRequestData("b", [1, 2, 3], [], params, [7, 8], 0)],
        cached_requests=[CachedRequestData("a", [9], 16, False, [4])],
        num_scheduled_tokens={"b": 3, "a": 1},  # b first: the batch order
        spec_token_ids={"a": [5, 6]},
        total_num_scheduled_tokens=4,
        num_decode_seqs=1,
        num_decode_tokens=1,
        preempted_ids=["c"],
        finished_ids=["d"],
        requests={"b": object()},  # the core's own: never sent
    )
    ops = M.decode_ops(M.encode([M.exec_op(sched), M.Resolve(), M.Shutdown()]))
    assert [type(op) for op in ops] == [M.Exec, M.Resolve, M.Shutdown]
    back = M.to_scheduler_output(ops[0].step)
    assert back == dataclasses.replace(sched, requests={})
    assert list(back.num_scheduled_tokens) == ["b", "a"]
    assert back.new_requests[0].sampling_params.structured_outputs.json == {"type": "object"}


@pytest.mark.parametrize(
    "frame",
    [
        pickle.dumps([("exec", None)]),
        b"\x00\x01junk",
        msgspec.msgpack.encode([["exec", "not a step"]]),
        msgspec.msgpack.encode([["format_disk"]]),
        msgspec.msgpack.encode({"exec": 1}),
    ],
)
def test_anything_else_is_a_value_error(frame):
    with pytest.raises(ValueError):
        M.decode_ops(frame)
    with pytest.raises(ValueError):
        M.decode_control(frame)
