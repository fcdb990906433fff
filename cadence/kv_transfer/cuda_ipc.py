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

import logging
import pickle

import torch
import zmq
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from cadence.kv_transfer.connector import KVLayers
from cadence.kv_transfer.tcp import TcpKVConnector, done_future

logger = logging.getLogger(__name__)

MAX_STAGED_BYTES = 2 << 30  # GPU memory outside the KV pool (the memory profile's headroom)
_DEVICE_ARG = 6  # rebuild_cuda_tensor's storage_device


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class CudaIpcKVConnector(TcpKVConnector):
    max_staged_bytes = MAX_STAGED_BYTES

    def __init__(self, layers: KVLayers, *args, **kw) -> None:
        if not layers.on_gpu:
            raise ValueError("--kv-connector cuda_ipc needs the K/V pool on a GPU: use shm or tcp")
        self._buffers: dict[str, torch.Tensor] = {}  # transfer id -> its staged buffer
        self._local: dict[str, int] = {}  # a GPU's UUID -> its index in this process
        self._uuid = device_uuid(layers.device.index or 0)
        super().__init__(layers, *args, **kw)

    # ---- prefill side -----------------------------------------------------------------

    def _stage(self, transfer_id: str, block_ids: list[int]):
        """All layers' blocks into one buffer (one handle to open), [2, n, block, heads,
        dim] per layer, back to back."""
        layers, n = self.layers, len(block_ids)
        sizes = [2 * n * c[0, 0].numel() * c.element_size() for c in layers.kv_caches]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8, device=layers.device)
        ids = torch.tensor(block_ids, dtype=torch.long, device=layers.device)
        views, at = [], 0
        for layer, (cache, size) in enumerate(zip(layers.kv_caches, sizes)):
            view = buffer[at : at + size].view(cache.dtype).view(layers.block_shape(layer, n))
            torch.index_select(cache, 1, ids, out=view)
            views.append(view)
            at += size
        self._buffers[transfer_id] = buffer
        return done_future(views), sum(sizes)

    def _reply(self, transfer_id: str, tensors: list[torch.Tensor], lo: int, n: int):
        # On the server thread: sharing records an event on this thread's current stream
        # (the device's default stream, which the engine's gather was queued on).
        with torch.cuda.device(self.layers.device):
            _, args = reduce_tensor(self._buffers[transfer_id])
        args = list(args)
        args[_DEVICE_ARG] = self._uuid
        header = {"first": lo, "total_blocks": tensors[0].shape[1], "ipc": True}
        return header, [pickle.dumps(tuple(args))]

    def _discard(self, transfer_id: str) -> None:
        if self._buffers.pop(transfer_id, None) is not None:
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
        if not info.get("ipc") or len(frames) != 1:
            raise RuntimeError("the prefill engine did not answer with a CUDA IPC handle")
        args = list(pickle.loads(frames[0].bytes))
        args[_DEVICE_ARG] = self._local_index(args[_DEVICE_ARG])
        # Opened on the current stream (the copy stream: `write` iterates under it), which
        # then waits for the prefill engine's staging copy.
        buffer = rebuild_cuda_tensor(*args)
        at, lo, total = 0, info["first"], info["total_blocks"]
        for layer, cache in enumerate(self.layers.kv_caches):
            size = 2 * total * cache[0, 0].numel() * cache.element_size()
            staged = buffer[at : at + size].view(cache.dtype)
            yield staged.view(self.layers.block_shape(layer, total))[:, lo : lo + n]
            at += size

    def _loaded(self, info: dict, sock: zmq.Socket) -> None:
        sock.send_multipart([b"release", info.get("transfer_id", "").encode()])

    def close(self) -> None:
        super().close()
        self._buffers.clear()
