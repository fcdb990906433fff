"""The same-host GPU connector: staged K/V stays on the prefill engine's GPU, and a decode
engine on the same machine copies the blocks it wants from there into its own pool, GPU to
GPU (peer to peer between two GPUs, a device copy when both engines share one). No K/V
goes through host memory or a socket: a fetch is answered with a CUDA IPC handle of the
staged buffer (torch's sharing of CUDA storage, as torch.multiprocessing does it: the
reader's copy waits on an event recorded after the staging copy, and the prefill engine's
allocator keeps the memory until the reader has let go of it).

    prefill:  save()  copies the finished request's blocks into one buffer on its GPU
              (queued on the engine's stream: no stall), kept until a decode engine has
              read it and said "release" (at most MAX_STAGED_BYTES unfetched)
    decode:   the loader thread opens the handle, copies on its side stream, releases

GPUs are matched by UUID, so each engine may order CUDA_VISIBLE_DEVICES its own way, but
the decode engine must see the prefill engine's GPU (e.g. decode: CUDA_VISIBLE_DEVICES=1,0
with prefill on 0); when it cannot, its loads fail and it computes prompts itself.
"""

from __future__ import annotations

import base64
import logging
import re

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from cadence.kv_transfer.connector import KVLayers
from cadence.kv_transfer.tcp import Staged, TcpKVConnector, done_future

logger = logging.getLogger(__name__)

MAX_STAGED_BYTES = 2 << 30  # GPU memory outside the KV pool (the memory profile's headroom)

# rebuild_cuda_tensor's arguments, as reduce_tensor makes them for a 1-D uint8 buffer. They
# travel as JSON (never pickled: a decode engine reads answers from whatever address a
# request names): the bytes in base64, the GPU as its UUID, the classes and dtype fixed.
_IPC_FIELDS = (
    ("size", list),
    ("stride", list),
    ("offset", int),
    ("storage_cls", None),
    ("dtype", None),
    ("device", str),
    ("handle", bytes),
    ("storage_size_bytes", int),
    ("storage_offset_bytes", int),
    ("requires_grad", bool),
    ("ref_counter_handle", bytes),
    ("ref_counter_offset", int),
    ("event_handle", bytes),
    ("event_sync_required", bool),
)
# What torch's fields can be (torch/csrc/StorageSharing.cpp, CudaIPCTypes.h). Opening the
# handle maps the producer's memory; releasing it decrements an int64 at
# ref_counter_offset in the shared-memory file ref_counter_handle names: a forged offset
# would write outside that file, a forged name into another file.
IPC_HANDLE_BYTES = 64  # cudaIpcEventHandle_t (the memory handle may carry a prefix)
MAX_MEM_HANDLE_BYTES = 4096
REF_COUNTER_SLOTS = 10000  # CUDA_IPC_REF_COUNTER_FILE_SIZE: int64 counters per file
REF_COUNTER_NAME = re.compile(rb"/torch_[0-9]+_[0-9]+_[0-9]+")


def encode_ipc(args: tuple, uuid: str) -> dict:
    """reduce_tensor's args (without the tensor class) -> plain JSON values."""
    out = {}
    for (name, kind), value in zip(_IPC_FIELDS, args[1:], strict=True):
        if name == "device":
            value = uuid
        elif kind is bytes:
            value = base64.b64encode(value).decode() if value is not None else None
        elif kind is list:
            value = list(value)
        elif kind is None:
            continue
        out[name] = value
    return out


def decode_ipc(fields: dict, device: int, nbytes: int, device_bytes: int) -> tuple:
    """The JSON of encode_ipc -> rebuild_cuda_tensor's args, each value type- and
    range-checked: a whole 1-D buffer of exactly `nbytes` bytes inside a device of
    `device_bytes`, a ref counter slot inside its file, handles of their sizes."""
    args: list = [torch.Tensor]
    for name, kind in _IPC_FIELDS:
        if name == "storage_cls":
            args.append(torch.storage.TypedStorage)  # (what reduce_tensor sends)
            continue
        if name == "dtype":
            args.append(torch.uint8)
            continue
        value = fields.get(name)
        if name == "device":
            args.append(device)
            continue
        if kind is bytes:
            if name == "event_handle" and value is None:
                args.append(None)
                continue
            try:
                value = base64.b64decode(value, validate=True) if isinstance(value, str) else None
            except ValueError:
                value = None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is list:
            ok = ok and len(value) == 1 and all(type(v) is int and v >= 0 for v in value)
        if not ok:
            raise RuntimeError(f"bad CUDA IPC field {name!r} in the prefill engine's answer")
        args.append(tuple(value) if kind is list else value)
    f = dict(zip((n for n, _ in _IPC_FIELDS), args[1:]))
    checks = {
        "size": f["size"] == (nbytes,) and f["stride"] == (1,) and f["offset"] == 0,
        "storage_size_bytes": f["storage_size_bytes"] == nbytes,
        "storage_offset_bytes": 0 <= f["storage_offset_bytes"] <= device_bytes - nbytes,
        "handle": 0 < len(f["handle"]) <= MAX_MEM_HANDLE_BYTES,
        "ref_counter_handle": REF_COUNTER_NAME.fullmatch(f["ref_counter_handle"]) is not None,
        "ref_counter_offset": 0 <= f["ref_counter_offset"] < REF_COUNTER_SLOTS,
        "event_handle": f["event_handle"] is None or len(f["event_handle"]) == IPC_HANDLE_BYTES,
        "requires_grad": f["requires_grad"] is False,
    }
    for name, ok in checks.items():
        if not ok:
            raise RuntimeError(
                f"CUDA IPC field {name!r} is out of range in the prefill engine's answer"
            )
    return tuple(args)


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class CudaIpcKVConnector(TcpKVConnector):
    max_staged_bytes = MAX_STAGED_BYTES

    keeps_until_release = True

    def __init__(self, layers: KVLayers, *args, **kw) -> None:
        if not layers.on_gpu:
            raise ValueError("--kv-connector cuda_ipc needs the K/V pool on a GPU: use shm or tcp")
        self._local: dict[str, int] = {}  # a GPU's UUID -> its index in this process
        self._uuid = device_uuid(layers.device.index or 0)
        super().__init__(layers, *args, **kw)

    # ---- prefill side -----------------------------------------------------------------

    def _stage(self, block_ids: list[int]) -> Staged:
        """All layers' blocks into one buffer (one handle to open), [2, n, block, heads,
        dim] per layer, back to back."""
        layers, nbytes = self.layers, self.layers.nbytes(len(block_ids))
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=layers.device)
        ids = torch.tensor(block_ids, dtype=torch.long, device=layers.device)
        views = layers.carve(buffer, len(block_ids))
        for cache, view in zip(layers.kv_caches, views):
            torch.index_select(cache, 1, ids, out=view)
        return Staged(done_future(views), nbytes, resource=buffer)

    def _reply(self, entry: Staged, tensors: list[torch.Tensor], lo: int, n: int):
        # On the server thread: sharing records an event on this thread's current stream
        # (the device's default stream, which the engine's gather was queued on).
        with torch.cuda.device(self.layers.device):
            _, args = reduce_tensor(entry.resource)
        ipc = encode_ipc(args, self._uuid)
        return {"first": lo, "total_blocks": tensors[0].shape[1], "ipc": ipc}, []

    def _discard(self, entry: Staged) -> None:
        entry.resource = None
        torch.cuda.ipc_collect()  # frees buffers that readers have let go of

    # ---- decode side ------------------------------------------------------------------

    def _local_index(self, uuid: str) -> int:
        if uuid not in self._local:
            for i in range(torch.cuda.device_count()):
                self._local[device_uuid(i)] = i
        if uuid not in self._local:
            raise RuntimeError(
                f"the prefill engine's GPU ({uuid}) is not visible to this engine: "
                "cuda_ipc needs both engines' GPUs in CUDA_VISIBLE_DEVICES (or use shm)"
            )
        return self._local[uuid]

    def _received_layers(self, info: dict, frames: list, n: int):
        ipc = info.get("ipc")
        if not isinstance(ipc, dict) or frames:
            raise RuntimeError("the prefill engine did not answer with a CUDA IPC handle")
        if not isinstance(ipc.get("device"), str):
            raise RuntimeError("bad CUDA IPC field 'device' in the prefill engine's answer")
        lo, total = info.get("first"), info.get("total_blocks")
        if type(lo) is not int or type(total) is not int or not 0 <= lo <= lo + n <= total:
            raise RuntimeError("the prefill engine's answer has a bad block range")
        index = self._local_index(ipc["device"])
        device_bytes = torch.cuda.get_device_properties(index).total_memory
        args = decode_ipc(ipc, index, self.layers.nbytes(total), device_bytes)
        # Opened on the current stream (the copy stream: `write` iterates under it), which
        # then waits for the prefill engine's staging copy.
        buffer = rebuild_cuda_tensor(*args)
        for staged in self.layers.carve(buffer, total):
            yield staged[:, lo : lo + n]
