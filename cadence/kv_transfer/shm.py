"""The same-host connector: staged K/V in shared memory files, only their names over ZMQ.

The prefill engine writes a finished request's K/V once, straight from its pool into a file
under /dev/shm (one file per transfer: the layers back to back, [2, n, block, heads, dim]
each); a decode engine on the same machine maps the file, copies the blocks it wants into
its own pool (host to device on a GPU), and sends "release", on which the file is deleted.
No bytes go through a socket. Files left by a decode engine that never released them go
with the staging bound (oldest first) or when the prefill engine stops.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import numpy as np
import torch
import zmq

from cadence.kv_transfer.tcp import TcpKVConnector

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


class ShmKVConnector(TcpKVConnector):
    def __init__(self, *args, **kw) -> None:
        self._files: dict[str, str] = {}  # transfer id -> its file
        self._prefix = f"cadence-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        super().__init__(*args, **kw)

    def _stage(self, transfer_id: str, block_ids: list[int]) -> list[torch.Tensor]:
        layers = self.layers.kv_caches
        per_layer = [2 * len(block_ids) * c[0, 0].numel() * c.element_size() for c in layers]
        path = os.path.join(SHM_DIR or "/tmp", f"{self._prefix}-{len(self._files)}-{transfer_id}")
        raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="w+", shape=(sum(per_layer),)))
        ids = torch.tensor(block_ids, dtype=torch.long, device=layers[0].device)
        tensors, at = [], 0
        for cache, size in zip(layers, per_layer):
            dst = raw[at : at + size].view(cache.dtype).view(2, len(block_ids), *cache.shape[2:])
            dst.copy_(cache.index_select(1, ids))
            tensors.append(dst)
            at += size
        self._files[transfer_id] = path
        return tensors

    def _discard(self, transfer_id: str) -> None:
        path = self._files.pop(transfer_id, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _reply(self, transfer_id: str, tensors: list[torch.Tensor], lo: int, n: int):
        total = tensors[0].shape[1]
        return {"shm": self._files[transfer_id], "first": lo, "total_blocks": total}, []

    def _received_layers(self, info: dict, frames: list, n: int, sock: zmq.Socket):
        path = info.get("shm")
        if not path:
            raise RuntimeError("the prefill engine did not answer through shared memory")
        try:
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            at, lo, total = 0, info["first"], info["total_blocks"]
            for cache in self.layers.kv_caches:
                block = cache[0, 0].numel() * cache.element_size()  # bytes of one block's K
                size = 2 * total * block
                wanted = mm[at : at + size].reshape(2, total, block)[:, lo : lo + n]
                yield torch.from_numpy(wanted.copy()).view(-1)  # a private copy of n blocks
                at += size
            del mm
        finally:
            sock.send_multipart([b"release", info.get("transfer_id", "").encode()])

    def close(self) -> None:
        super().close()
        for tid in list(self._files):  # fetched but never released
            self._discard(tid)
