"""What a prefill engine's CUDA IPC answer may hold: plain JSON values, checked one by one
on the decode side (a decode engine reads answers from whatever address a request names,
so nothing in them is unpickled)."""

from __future__ import annotations

import json

import pytest
import torch

from cadence.kv_transfer.cuda_ipc import decode_ipc, encode_ipc

# reduce_tensor's args for a 1-D uint8 CUDA buffer, as torch makes them (the GPU is index 0)
ARGS = (
    torch.Tensor,
    torch.Size([4096]),
    (1,),
    0,
    torch.storage.TypedStorage,
    torch.uint8,
    0,
    b"\x01handle\x00\xff",
    8192,
    512,
    False,
    b"/torch_123_456",
    64,
    b"\x02event",
    True,
)


def test_the_fields_travel_as_json_and_come_back_as_rebuild_args():
    sent = json.loads(json.dumps(encode_ipc(ARGS, "GPU-abc")))
    assert sent["device"] == "GPU-abc"
    back = decode_ipc(sent, device=1)
    assert back == (*ARGS[:6], 1, *ARGS[7:])


@pytest.mark.parametrize(
    "field, value",
    [
        ("size", [1, 2]),  # not a 1-D buffer
        ("size", "4096"),
        ("offset", True),
        ("handle", "not base64!"),
        ("storage_size_bytes", 1.5),
        ("ref_counter_handle", None),
        ("event_sync_required", "yes"),
    ],
)
def test_a_bad_field_is_refused(field, value):
    sent = json.loads(json.dumps(encode_ipc(ARGS, "GPU-abc")))
    sent[field] = value
    with pytest.raises((RuntimeError, ValueError)):
        decode_ipc(sent, device=0)
