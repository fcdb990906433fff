"""The TCP connector (ZMQ): a prefill engine serves staged K/V, a decode engine fetches it.

    prefill:  save()  copies the finished request's blocks to host memory, layer by layer
              (on a GPU: on a stager thread and a side stream), and keeps them under its
              transfer id (at most MAX_STAGED_BYTES in all, the oldest dropped first) until a decode engine asks; a thread answers on a ROUTER
              socket: [transfer id, first block, block count] -> [header, one frame per layer]
    decode:   start_load() hands the fetch to a loader thread, which writes each layer's
              frame into the request's blocks as it reads them; finished_loads() tells the
              scheduler. The engine keeps stepping other requests meanwhile.

Works between hosts and on one host (127.0.0.1), CPU or GPU (through host memory).
Subclasses change the transport (the `_stage` ... `_loaded` hooks): shm.py, cuda_ipc.py.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import zmq

from cadence.kv_transfer.connector import DECODE, PREFILL, KVLayers

logger = logging.getLogger(__name__)

MAX_STAGED_BYTES = 4 << 30  # K/V a prefill engine keeps for decode engines to fetch
LOAD_TIMEOUT_S = 30.0  # a fetch that takes longer fails (the request computes locally)
POLL_MS = 200


def done_future(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class TcpKVConnector:
    max_staged_bytes = MAX_STAGED_BYTES

    def __init__(self, layers: KVLayers, role: str, host: str = "127.0.0.1", port: int = 0) -> None:
        if role not in (PREFILL, DECODE):
            raise ValueError(f"kv_role must be prefill or decode, got {role!r}")
        self.layers = layers
        self.role = role
        self.addr = ""
        self._ctx = zmq.Context()
        self._closed = threading.Event()
        self._staged: OrderedDict[str, tuple[int, list[torch.Tensor], int]] = OrderedDict()
        self._staged_bytes = 0
        self._lock = threading.Lock()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._loader = self._stager = None
        if role == PREFILL:
            self._stager = ThreadPoolExecutor(1, thread_name_prefix="cadence-kv-stage")
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            if port:
                sock.bind(f"tcp://{host}:{port}")
            else:
                port = sock.bind_to_random_port(f"tcp://{host}")
            self.addr = f"tcp://{host}:{port}"
            self._server = threading.Thread(
                target=self._serve, args=(sock,), name="cadence-kv-server", daemon=True
            )
            self._server.start()
            logger.info("KV transfer (prefill side) serving staged K/V on %s", self.addr)
        else:
            self._loader = ThreadPoolExecutor(2, thread_name_prefix="cadence-kv-load")

    # ---- prefill side -----------------------------------------------------------------

    def save(self, transfer_id: str, block_ids: list[int], num_tokens: int) -> None:
        """Stage a finished request's K/V. Called on the engine thread: on a GPU it only
        queues a device-side copy of the blocks; the copy to host memory runs on the
        stager thread (a fetch waits for it), so the engine does not stall."""
        staged, nbytes = self._stage(transfer_id, block_ids)
        with self._lock:
            old = self._staged.pop(transfer_id, None)
            if old is not None:
                self._staged_bytes -= old[2]
                self._discard(transfer_id)
            self._staged[transfer_id] = (num_tokens, staged, nbytes)
            self._staged_bytes += nbytes
            while self._staged_bytes > self.max_staged_bytes and len(self._staged) > 1:
                dropped, (_, _, size) = self._staged.popitem(last=False)
                self._staged_bytes -= size
                self._discard(dropped)
                logger.warning("KV transfer %s dropped unfetched (staging full)", dropped)

    # The transport: how staged K/V is kept, sent and read (shm.py keeps it in files,
    # cuda_ipc.py on the GPU).

    def _stage(self, transfer_id: str, block_ids: list[int]) -> tuple[Future, int]:
        """(a future of each layer's K/V of these blocks in host memory, [2, n, block,
        heads, dim]; its size in bytes)."""
        tensors = self.layers.gather(block_ids)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if not self.layers.on_gpu:
            return done_future(tensors), nbytes
        return self._stager.submit(self.layers.to_host, tensors, self.layers.engine_point()), nbytes

    def _discard(self, transfer_id: str) -> None:
        """A staged transfer is gone (fetched and released, dropped, or replaced)."""

    def _reply(self, transfer_id: str, tensors: list[torch.Tensor], lo: int, n: int):
        """(header fields, frames) answering a fetch of blocks [lo, lo + n)."""
        self._discard(transfer_id)
        frames = [t[:, lo : lo + n].contiguous().view(torch.uint8).numpy() for t in tensors]
        return {}, frames

    def _received_layers(self, info: dict, frames: list, n: int):
        """Per layer, the fetched blocks' K/V ([2, n, block, heads, dim])."""
        if len(frames) != len(self.layers.kv_caches):
            raise RuntimeError(f"{len(frames)} layers sent, {len(self.layers.kv_caches)} expected")
        with warnings.catch_warnings():  # read-only, and only read: no copy
            warnings.simplefilter("ignore", UserWarning)
            for layer, (frame, cache) in enumerate(zip(frames, self.layers.kv_caches)):
                raw = torch.frombuffer(frame.buffer, dtype=torch.uint8)
                yield raw.view(cache.dtype).view(self.layers.block_shape(layer, n))

    def _loaded(self, info: dict, sock: zmq.Socket) -> None:
        """The fetched K/V is in this engine's blocks: the server may let go of its copy
        (shm deletes the file, cuda_ipc frees the buffer; here it went with the reply)."""
        sock.send_multipart([b"release", info.get("transfer_id", "").encode()])

    @property
    def num_staged(self) -> int:
        return len(self._staged)

    def _take(self, transfer_id: str):
        with self._lock:
            entry = self._staged.pop(transfer_id, None)
            if entry is not None:
                self._staged_bytes -= entry[2]
        return entry

    def _serve(self, sock: zmq.Socket) -> None:
        while not self._closed.is_set():
            if not sock.poll(POLL_MS):
                continue
            msg = sock.recv_multipart()
            if len(msg) == 3:  # [ident, b"release", transfer id]: the reader is done
                self._discard(msg[2].decode())
                continue
            ident, tid, first, count = msg
            entry = self._take(tid.decode())
            if entry is None:
                header = {"ok": False, "error": f"no staged K/V for transfer {tid.decode()!r}"}
                sock.send_multipart([ident, json.dumps(header).encode()])
                continue
            num_tokens, staged, _ = entry
            try:
                tensors = staged.result()
            except Exception as e:  # the staging copy failed
                header = {"ok": False, "error": f"staging failed: {type(e).__name__}: {e}"}
                sock.send_multipart([ident, json.dumps(header).encode()])
                continue
            lo, n = int(first), int(count)
            if lo + n > tensors[0].shape[1]:
                header = {"ok": False, "error": f"blocks [{lo}, {lo + n}) of {tensors[0].shape[1]}"}
                sock.send_multipart([ident, json.dumps(header).encode()])
                continue
            extra, frames = self._reply(tid.decode(), tensors, lo, n)
            header = {
                "ok": True,
                "transfer_id": tid.decode(),
                "num_tokens": num_tokens,
                "block_size": self.layers.block_size,
                "layout": self.layers.layout(),
                "num_blocks": n,
                **extra,
            }
            sock.send_multipart([ident, json.dumps(header).encode(), *frames], copy=False)
        sock.close(linger=0)

    # ---- decode side ------------------------------------------------------------------

    def start_load(
        self, request_id: str, params: dict, block_ids: list[int], start: int, end: int
    ) -> None:
        """Fetch the K/V of tokens [start, end) (start a multiple of the block size) into
        the request's blocks (`block_ids`: all of them, from token 0)."""
        bs = self.layers.block_size
        first, last = start // bs, -(-end // bs)
        self._loader.submit(
            self._load,
            request_id,
            params["remote_addr"],
            params["transfer_id"],
            first,
            block_ids[first:last],
            self.layers.engine_point(),
        )

    def _load(
        self, request_id: str, addr: str, tid: str, first: int, dst: list[int], after
    ) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(addr)
            sock.send_multipart([tid.encode(), str(first).encode(), str(len(dst)).encode()])
            if not sock.poll(int(LOAD_TIMEOUT_S * 1000)):
                raise TimeoutError(f"no answer from {addr} in {LOAD_TIMEOUT_S:g} s")
            header, *frames = sock.recv_multipart(copy=False)
            info = json.loads(header.bytes)
            if not info["ok"]:
                raise RuntimeError(info["error"])
            layout = self.layers.layout()
            if (
                info["block_size"] != self.layers.block_size
                or [[list(s), d] for s, d in layout] != info["layout"]
            ):
                raise RuntimeError("the prefill engine's K/V layout differs from this one's")
            try:
                self.layers.write(dst, self._received_layers(info, frames, len(dst)), after)
            finally:
                self._loaded(info, sock)
            self._done.put((request_id, None))
        except Exception as e:  # any failure: the request computes its prompt locally
            self._done.put((request_id, f"{type(e).__name__}: {e}"))
        finally:
            sock.close(linger=1000)  # (a "release" may still be on its way out)

    def finished_loads(self) -> list[tuple[str, str | None]]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._closed.set()
        if self._loader is not None:
            self._loader.shutdown(wait=True, cancel_futures=False)
        if self.role == PREFILL:
            self._server.join(2)
            self._stager.shutdown(wait=True)
            with self._lock:
                for tid in list(self._staged):
                    self._discard(tid)
                self._staged.clear()
        self._ctx.term()
