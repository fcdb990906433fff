"""The same-host connector: staged K/V in shared memory files, only their names over ZMQ.

The prefill engine writes a finished request's K/V once, straight from its pool into a file
under /dev/shm (one file per transfer: the layers back to back, [2, n, block, heads, dim]
each); a decode engine on the same machine maps the file, copies the blocks it wants into
its own pool (host to device on a GPU), and then sends "release", on which the file is
deleted. No bytes go through a socket. Files left by a decode engine that never released them go
with the staging bound (oldest first) or when the prefill engine stops.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from concurrent.futures import Future

import numpy as np
import torch
import zmq

from cadence.kv_transfer.tcp import TcpKVConnector, done_future

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


class ShmKVConnector(TcpKVConnector):
    def __init__(self, *args, **kw) -> None:
        self._files: dict[str, str] = {}  # transfer id -> its file
        self._prefix = f"cadence-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        super().__init__(*args, **kw)

    def _stage(self, transfer_id: str, block_ids: list[int]) -> tuple[Future, int]:
        layers = self.layers.kv_caches
        n = len(block_ids)
        per_layer = [2 * n * c[0, 0].numel() * c.element_size() for c in layers]
        path = os.path.join(SHM_DIR or "/tmp", f"{self._prefix}-{len(self._files)}-{transfer_id}")
        raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="w+", shape=(sum(per_layer),)))
        self._files[transfer_id] = path
        files, at = [], 0
        for layer, (cache, size) in enumerate(zip(layers, per_layer)):
            files.append(
                raw[at : at + size].view(cache.dtype).view(self.layers.block_shape(layer, n))
            )
            at += size
        if not self.layers.on_gpu:  # straight from the pool into the file
            ids = torch.tensor(block_ids, dtype=torch.long)
            for cache, dst in zip(layers, files):
                torch.index_select(cache, 1, ids, out=dst)
            return done_future(files), sum(per_layer)
        on_device, after = self.layers.gather(block_ids), self.layers.engine_point()
        return self._stager.submit(self.layers.to_host, on_device, after, files), sum(per_layer)

    def _discard(self, transfer_id: str) -> None:
        path = self._files.pop(transfer_id, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _reply(self, transfer_id: str, tensors: list[torch.Tensor], lo: int, n: int):
        total = tensors[0].shape[1]
        return {"shm": self._files[transfer_id], "first": lo, "total_blocks": total}, []

    def _received_layers(self, info: dict, frames: list, n: int):
        path = info.get("shm")
        if not path:
            raise RuntimeError("the prefill engine did not answer through shared memory")
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        at, lo, total = 0, info["first"], info["total_blocks"]
        for layer, cache in enumerate(self.layers.kv_caches):
            block = cache[0, 0].numel() * cache.element_size()  # bytes of one block's K
            size = 2 * total * block
            wanted = mm[at : at + size].reshape(2, total, block)[:, lo : lo + n]
            with warnings.catch_warnings():  # read-only, and only read (release comes after)
                warnings.simplefilter("ignore", UserWarning)
                kv = torch.from_numpy(wanted)
            yield kv.view(cache.dtype).view(self.layers.block_shape(layer, n))
            at += size

    def _loaded(self, info: dict, sock: zmq.Socket) -> None:
        sock.send_multipart([b"release", info.get("transfer_id", "").encode()])

    def close(self) -> None:
        super().close()
        for tid in list(self._files):  # fetched but never released
            self._discard(tid)
