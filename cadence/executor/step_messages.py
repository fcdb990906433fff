"""What rank 0 and the other ranks say to each other, as msgspec messages (never pickle).

    rank 0 -> ranks    one frame per step: a list of ops, in order
        Exec(step)     run the forward pass of this scheduler output (its deltas only)
        Resolve()      read back the oldest pending sampling (append rank 0's ids)
        Shutdown()     leave
    ranks -> rank 0    Ready(rank) once loaded; Failed(rank, text) before exiting on an error

A frame decodes only into these types, field by field: a malformed one is a ValueError,
never code that runs. (The channel is authenticated too: channel_auth.py.)
"""

from __future__ import annotations

import msgspec

from cadence.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from cadence.lora_request import LoRALoad


class StepWire(msgspec.Struct, array_like=True):
    """A SchedulerOutput without the core's Request objects (ranks need only the deltas)."""

    new_requests: list[NewRequestData]
    cached_requests: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]  # (msgpack keeps the batch order)
    spec_token_ids: dict[str, list[int]]
    total_num_scheduled_tokens: int
    num_decode_seqs: int
    num_decode_tokens: int
    preempted_ids: list[str]
    finished_ids: list[str]
    lora_loads: list[LoRALoad]


# Every SchedulerOutput field travels but `requests` (tested: the two lists stay in step).
WIRE_FIELDS = StepWire.__struct_fields__


class Exec(msgspec.Struct, tag="exec", array_like=True):
    step: StepWire


class Resolve(msgspec.Struct, tag="resolve", array_like=True):
    pass


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class Ready(msgspec.Struct, tag="ready", array_like=True):
    rank: int


class Failed(msgspec.Struct, tag="error", array_like=True):
    rank: int
    text: str


Op = Exec | Resolve | Shutdown

_ops_encoder = msgspec.msgpack.Encoder()
_ops_decoder = msgspec.msgpack.Decoder(list[Op])
_control_decoder = msgspec.msgpack.Decoder(Ready | Failed)


def exec_op(sched: SchedulerOutput) -> Exec:
    return Exec(StepWire(**{name: getattr(sched, name) for name in WIRE_FIELDS}))


def to_scheduler_output(step: StepWire) -> SchedulerOutput:
    return SchedulerOutput(**{name: getattr(step, name) for name in WIRE_FIELDS})


def encode(message) -> bytes:
    """One frame: a list of ops, or one control message."""
    return _ops_encoder.encode(message)


def decode_ops(frame: bytes) -> list[Op]:
    """Raises msgspec.ValidationError / DecodeError (ValueErrors) on a malformed frame."""
    return _ops_decoder.decode(frame)


def decode_control(frame: bytes) -> Ready | Failed:
    return _control_decoder.decode(frame)
