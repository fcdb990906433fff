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

from cadence.kv_transfer.tcp import TcpKVConnector, done_future

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


class ShmKVConnector(TcpKVConnector):
    def __init__(self, *args, **kw) -> None:
        self._files: dict[str, str] = {}  # transfer id -> its file
        self._prefix = f"cadence-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        super().__init__(*args, **kw)

    def _stage(self, transfer_id: str, block_ids: list[int]) -> tuple[Future, int]:
        nbytes = self.layers.nbytes(len(block_ids))
        path = os.path.join(SHM_DIR or "/tmp", f"{self._prefix}-{len(self._files)}-{transfer_id}")
        raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="w+", shape=(nbytes,)))
        self._files[transfer_id] = path
        files = self.layers.carve(raw, len(block_ids))
        if not self.layers.on_gpu:  # straight from the pool into the file
            ids = torch.tensor(block_ids, dtype=torch.long)
            for cache, dst in zip(self.layers.kv_caches, files):
                torch.index_select(cache, 1, ids, out=dst)
            return done_future(files), nbytes
        on_device, after = self.layers.gather(block_ids), self.layers.engine_point()
        return self._stager.submit(self.layers.to_host, on_device, after, files), nbytes

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
        lo, total = info["first"], info["total_blocks"]
        with warnings.catch_warnings():  # read-only, and only read (release comes after)
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="r"))
        if raw.numel() != self.layers.nbytes(total) or not 0 <= lo <= lo + n <= total:
            raise RuntimeError("the prefill engine's shared-memory file has the wrong size")
        for staged in self.layers.carve(raw, total):
            yield staged[:, lo : lo + n]

    def close(self) -> None:
        super().close()
        for tid in list(self._files):  # fetched but never released
            self._discard(tid)
