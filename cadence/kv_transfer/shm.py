"""The same-host connector: staged K/V in shared memory files, only their names over ZMQ.

The prefill engine writes a finished request's K/V once, straight from its pool into a file
(one file per transfer: the layers back to back, [2, n, block, heads, dim] each); a decode
engine on the same machine maps the file, copies the blocks it wants into its own pool
(host to device on a GPU), and then sends "release", on which the file is deleted. No bytes
go through a socket.

The files are the engine's own: in a directory it creates under /dev/shm (mode 0700),
named by a counter (never by anything a request says), each created exclusively with mode
0600. Other users of the host cannot list, read or replace them; the decode engine must
run as the same user. A decode engine opens only a name of that form, under /dev/shm, that
is a regular file of its own user (no links followed). Files whose reader never released
them go with the staging bound (oldest first) or when the prefill engine stops (or, killed,
when the next engine on the host makes its directory: cadence/private_dirs.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import stat
import tempfile
import warnings

import numpy as np
import torch

from cadence.kv_transfer.tcp import Staged, TcpKVConnector, done_future
from cadence.private_dirs import make_private_dir, name_pattern

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
# "<the engine's directory>/<counter>", as _stage names them (or as engines named their
# directory before private_dirs: a decode engine still reads from a prefill engine of then)
DIR_PREFIX = "cadence-kv-"
FILE_NAME = re.compile(f"(?:{name_pattern(DIR_PREFIX)}|cadence-kv-[A-Za-z0-9_]{{8}})/[0-9]{{1,12}}")


class ShmKVConnector(TcpKVConnector):
    keeps_until_release = True

    def __init__(self, *args, **kw) -> None:
        self._dir = make_private_dir(DIR_PREFIX, SHM_DIR)  # mode 0700
        self._count = itertools.count()
        try:
            super().__init__(*args, **kw)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def _stage(self, block_ids: list[int]) -> Staged:
        nbytes = self.layers.nbytes(len(block_ids))
        path = os.path.join(self._dir, str(next(self._count)))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w+b") as f:
            f.truncate(nbytes)
            raw = torch.from_numpy(np.memmap(f, dtype=np.uint8, mode="r+", shape=(nbytes,)))
        files = self.layers.carve(raw, len(block_ids))
        if not self.layers.on_gpu:  # straight from the pool into the file
            ids = torch.tensor(block_ids, dtype=torch.long)
            for cache, dst in zip(self.layers.kv_caches, files):
                torch.index_select(cache, 1, ids, out=dst)
            return Staged(done_future(files), nbytes, resource=path)
        on_device, after = self.layers.gather(block_ids), self.layers.engine_point()
        staged = self._stager.submit(self.layers.to_host, on_device, after, files)
        return Staged(staged, nbytes, resource=path)

    def _discard(self, entry: Staged) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.resource)

    def _reply(self, entry: Staged, tensors: list[torch.Tensor], lo: int, n: int):
        name = os.path.relpath(entry.resource, SHM_DIR)
        return {"shm": name, "first": lo, "total_blocks": tensors[0].shape[1]}, []

    def _received_layers(self, info: dict, frames: list, n: int):
        name, lo, total = info.get("shm"), info.get("first"), info.get("total_blocks")
        if not isinstance(name, str) or FILE_NAME.fullmatch(name) is None or frames:
            raise RuntimeError("the prefill engine did not answer with a shared-memory file")
        if type(lo) is not int or type(total) is not int or not 0 <= lo <= lo + n <= total:
            raise RuntimeError("the prefill engine's answer has a bad block range")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise RuntimeError("the staged K/V is not a regular file of this user")
            if st.st_size != self.layers.nbytes(total):
                raise RuntimeError("the prefill engine's shared-memory file has the wrong size")
            with warnings.catch_warnings():  # read-only, and only read (release comes after)
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.from_numpy(np.memmap(f, dtype=np.uint8, mode="r"))
        for staged in self.layers.carve(raw, total):
            yield staged[:, lo : lo + n]

    def close(self) -> None:
        super().close()  # (releases every file it still holds)
        shutil.rmtree(self._dir, ignore_errors=True)
