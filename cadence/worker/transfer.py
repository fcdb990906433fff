"""Host <-> device copies that never make the host wait for work already queued."""

from __future__ import annotations

import numpy as np
import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the work already queued there: on
    CUDA through pinned memory and a non-blocking copy (a copy from pageable memory may
    synchronise with the stream, which would undo async scheduling). PyTorch's pinned
    allocator keeps the block until the copy has run."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def to_device_aligned(segments: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """int64 arrays on `device` in one copy, as views of one buffer in which each starts on
    a 16-byte boundary (2 int64s). Triton compiles a kernel once per pointer alignment it
    sees (16 bytes or not): unaligned views of one packed buffer would compile new variants
    in the middle of serving, at the whim of the token count."""
    offsets, at = [], 0
    for a in segments:
        offsets.append(at)
        at += -(-len(a) // 2) * 2
    host = np.zeros(at, dtype=np.int64)
    for o, a in zip(offsets, segments):
        host[o : o + len(a)] = a
    packed = to_device(torch.from_numpy(host), device)
    return [packed[o : o + len(a)] for o, a in zip(offsets, segments)]


def to_host_async(t: torch.Tensor | None) -> torch.Tensor | None:
    """A pinned host copy of a device tensor, started but not waited for: record an event
    after it and synchronise on that before reading."""
    if t is None:
        return None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
