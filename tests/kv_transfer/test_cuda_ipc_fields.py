"""What a prefill engine's CUDA IPC answer may hold: plain JSON values, checked one by one
on the decode side, types and ranges (nothing in them is unpickled, and no number torch
would use as an offset or size gets past the checks)."""

from __future__ import annotations

import json

import pytest
import torch

from cadence.kv_transfer.cuda_ipc import decode_ipc, encode_ipc

# reduce_tensor's args for a 1-D uint8 CUDA buffer, as torch makes them (the GPU is index 0)
NBYTES = 4096
ARGS = (
    torch.Tensor,
    torch.Size([NBYTES]),
    (1,),
    0,
    torch.storage.TypedStorage,
    torch.uint8,
    0,
    b"\x01handle\x00\xff" * 8,
    NBYTES,
    512,
    False,
    b"/torch_123_456_7",
    64,
    b"\x02event".ljust(64, b"\x00"),
    True,
)
GPU_BYTES = 80 << 30


def decode(sent: dict, device: int = 0) -> tuple:
    return decode_ipc(sent, device, NBYTES, GPU_BYTES)


def test_the_fields_travel_as_json_and_come_back_as_rebuild_args():
    sent = json.loads(json.dumps(encode_ipc(ARGS, "GPU-abc")))
    assert sent["device"] == "GPU-abc"
    back = decode(sent, device=1)
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
        # Forged numbers: each would make torch read or write where it must not.
        ("size", [NBYTES * 2]),  # more than the buffer holds
        ("stride", [2]),
        ("offset", 8),
        ("storage_size_bytes", NBYTES + 1),
        ("storage_offset_bytes", -512),
        ("storage_offset_bytes", GPU_BYTES),  # past the end of the device
        ("ref_counter_offset", 10000),  # past the ref counter file: an out-of-bounds write
        ("ref_counter_offset", -1),
        ("ref_counter_handle", "L2V0Yy9wYXNzd2Q="),  # b"/etc/passwd": not torch's counter
        ("event_handle", "AAAA"),  # 3 bytes, not a CUDA event handle
        ("handle", ""),
        ("requires_grad", True),
    ],
)
def test_a_bad_field_is_refused(field, value):
    sent = json.loads(json.dumps(encode_ipc(ARGS, "GPU-abc")))
    sent[field] = value
    with pytest.raises((RuntimeError, ValueError)):
        decode(sent)
