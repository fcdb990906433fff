"""The TCP connector (ZMQ): a prefill engine serves staged K/V, a decode engine fetches it.

    prefill:  save()  copies the finished request's blocks to host memory, layer by layer
              (on a GPU: on a stager thread and a side stream), and keeps them under its
              transfer id (at most MAX_STAGED_BYTES in all, the oldest dropped first) until
              a decode engine asks; a thread answers on a ROUTER socket:
              [transfer id, first block, block count] -> [header, one frame per layer]
    decode:   start_load() hands the fetch to a loader thread, which writes each layer's
              frame into the request's blocks as it reads them; finished_loads() tells the
              scheduler. The engine keeps stepping other requests meanwhile.

Works between hosts and on one host (127.0.0.1), CPU or GPU (through host memory).
Subclasses change the transport (the `_stage` ... `_received_layers` hooks): shm.py,
cuda_ipc.py.

Trust. Both sides hold the deployment's secret (--kv-transfer-secret), from which they
derive CURVE keys (channel_auth.py): the server answers only decode engines that hold it,
and a decode engine accepts answers only from a server that holds it, so nobody else can
read staged K/V, release it, or feed a decode engine K/V of their own. Still, every
message is checked field by field: a malformed or duplicate one gets an error answer (the
reader computes its prompt itself) and the server thread never dies of it. A transfer is
served once; the transport's resources (a file, a GPU buffer) are always let go of: on the
reader's "release", when the staging bound drops them, or when the engine stops.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import warnings
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from cadence.channel_auth import ChannelGuard, keys_from_secret, make_client
from cadence.kv_transfer.connector import DECODE, PREFILL, KVLayers
from cadence.kv_transfer.params import check_transfer_id

logger = logging.getLogger(__name__)

MAX_STAGED_BYTES = 4 << 30  # K/V a prefill engine keeps for decode engines to fetch
LOAD_TIMEOUT_S = 30.0  # a fetch that takes longer fails (the request computes locally)
HANDSHAKE_TIMEOUT_S = 5.0  # no authenticated connection by then: the load fails
POLL_MS = 200
MAX_BLOCK_NUMBER = 1 << 31  # a block index or count past this is not a real request


def done_future(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


@dataclass
class Staged:
    """One transfer's K/V, kept for a decode engine."""

    tensors: Future  # of each layer's K/V of the blocks, [2, n, block, heads, dim]
    nbytes: int
    num_tokens: int = 0
    resource: object = None  # the transport's own (shm: the file; cuda_ipc: the GPU buffer)
    fetched: bool = False  # answered (a transfer is served once); kept until "release"


class TcpKVConnector:
    max_staged_bytes = MAX_STAGED_BYTES
    # The answer carries the bytes: nothing to keep once it is sent. (shm and cuda_ipc
    # answer with where the bytes are, and keep them until the reader's "release".)
    keeps_until_release = False

    def __init__(
        self, layers: KVLayers, role: str, secret: str, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        if role not in (PREFILL, DECODE):
            raise ValueError(f"kv_role must be prefill or decode, got {role!r}")
        self.layers = layers
        self.role = role
        self.addr = ""
        self._ctx = zmq.Context()
        self._server_keys = keys_from_secret(secret, "kv-server")
        self._client_keys = keys_from_secret(secret, "kv-client")
        self._guard: ChannelGuard | None = None
        self._closed = threading.Event()
        self._staged: OrderedDict[str, Staged] = OrderedDict()
        self._staged_bytes = 0
        self._lock = threading.Lock()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._loader = self._stager = None
        if role == PREFILL:
            self._stager = ThreadPoolExecutor(1, thread_name_prefix="cadence-kv-stage")
            self._guard = ChannelGuard(
                self._ctx, self._server_keys, [self._client_keys.public], "K/V transfer"
            )
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            self._guard.serve(sock)
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
        stager thread (a fetch waits for it), so the engine does not stall. A transfer id
        staged before is replaced (its old K/V let go of)."""
        check_transfer_id(transfer_id)
        entry = self._stage(block_ids)
        entry.num_tokens = num_tokens
        dropped = []
        with self._lock:
            old = self._staged.pop(transfer_id, None)
            if old is not None:
                logger.warning(
                    "KV transfer %s staged again: the earlier K/V is dropped", transfer_id
                )
                self._staged_bytes -= old.nbytes
                dropped.append(old)
            self._staged[transfer_id] = entry
            self._staged_bytes += entry.nbytes
            while self._staged_bytes > self.max_staged_bytes and len(self._staged) > 1:
                tid, oldest = self._staged.popitem(last=False)
                self._staged_bytes -= oldest.nbytes
                dropped.append(oldest)
                if not oldest.fetched:
                    logger.warning("KV transfer %s dropped unfetched (staging full)", tid)
        for entry in dropped:
            self._discard(entry)

    # The transport: how staged K/V is kept, sent and read (shm.py keeps it in files,
    # cuda_ipc.py on the GPU).

    def _stage(self, block_ids: list[int]) -> Staged:
        """These blocks' K/V, copied (or being copied) out of the pool: each layer's K/V
        in host memory, [2, n, block, heads, dim]."""
        tensors = self.layers.gather(block_ids)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if not self.layers.on_gpu:
            return Staged(done_future(tensors), nbytes)
        after = self.layers.engine_point()
        return Staged(self._stager.submit(self.layers.to_host, tensors, after), nbytes)

    def _discard(self, entry: Staged) -> None:
        """A staged transfer is gone (released, dropped or replaced): free what it holds."""

    def _reply(self, entry: Staged, tensors: list[torch.Tensor], lo: int, n: int):
        """(header fields, frames) answering a fetch of blocks [lo, lo + n)."""
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

    def _loaded(self, tid: str, sock: zmq.Socket) -> None:
        """The fetched K/V is in this engine's blocks: the server may let go of its copy."""
        if self.keeps_until_release:
            sock.send_multipart([b"release", tid.encode()])

    @property
    def num_staged(self) -> int:
        """Transfers held: staged, or fetched and awaiting their reader's release."""
        return len(self._staged)

    def _fetch(self, tid: str) -> Staged | None:
        """The transfer's entry, marked fetched (kept until release) or taken out; None
        if it is not staged or was served already."""
        with self._lock:
            entry = self._staged.get(tid)
            if entry is None or entry.fetched:
                return None
            entry.fetched = True
            if not self.keeps_until_release:
                del self._staged[tid]
                self._staged_bytes -= entry.nbytes
        return entry

    def _release(self, tid: str) -> None:
        with self._lock:
            entry = self._staged.get(tid)
            if entry is None or not entry.fetched:
                return  # (not ours to drop: never served, or gone already)
            del self._staged[tid]
            self._staged_bytes -= entry.nbytes
        self._discard(entry)

    def _serve(self, sock: zmq.Socket) -> None:
        while not self._closed.is_set():
            if not sock.poll(POLL_MS):
                continue
            msg = sock.recv_multipart()
            try:
                self._answer(sock, msg)
            except Exception:  # never let one message end the server (decode engines wait)
                logger.exception("K/V server: dropped a message it could not answer")
        sock.close(linger=0)

    def _answer(self, sock: zmq.Socket, msg: list[bytes]) -> None:
        ident, parts = msg[0], msg[1:]

        def fail(why: str) -> None:
            sock.send_multipart([ident, json.dumps({"ok": False, "error": why}).encode()])

        if len(parts) == 2 and parts[0] == b"release":  # the reader is done with it
            self._release(_text(parts[1]))
            return
        if len(parts) != 3:
            return fail(f"malformed fetch ({len(parts)} frames)")
        try:
            tid = check_transfer_id(_text(parts[0]))
            lo, n = _block_number(parts[1]), _block_number(parts[2])
        except ValueError as e:
            return fail(f"malformed fetch: {e}")
        entry = self._fetch(tid)
        if entry is None:
            return fail(f"no staged K/V for transfer {tid!r} (never staged, or served)")
        try:
            tensors = entry.tensors.result()
        except Exception as e:  # the staging copy failed
            self._let_go(tid, entry)
            return fail(f"staging failed: {type(e).__name__}: {e}")
        total = tensors[0].shape[1]
        if n < 1 or lo + n > total:
            self._let_go(tid, entry)
            return fail(f"blocks [{lo}, {lo + n}) of {total}")
        extra, frames = self._reply(entry, tensors, lo, n)
        header = {
            "ok": True,
            "transfer_id": tid,
            "num_tokens": entry.num_tokens,
            "block_size": self.layers.block_size,
            "layout": self.layers.layout(),
            "num_blocks": n,
            **extra,
        }
        sock.send_multipart([ident, json.dumps(header).encode(), *frames], copy=False)
        if not self.keeps_until_release:
            self._discard(entry)

    def _let_go(self, tid: str, entry: Staged) -> None:
        """A fetched transfer that could not be answered: free it now."""
        if self.keeps_until_release:
            self._release(tid)
        else:
            self._discard(entry)

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
            make_client(sock, self._client_keys, self._server_keys.public)
            wait_handshake(sock, addr, HANDSHAKE_TIMEOUT_S)
            sock.send_multipart([tid.encode(), str(first).encode(), str(len(dst)).encode()])
            if not sock.poll(int(LOAD_TIMEOUT_S * 1000)):
                raise TimeoutError(f"no answer from {addr} in {LOAD_TIMEOUT_S:g} s")
            header, *frames = sock.recv_multipart(copy=False)
            info = json.loads(header.bytes)
            if not isinstance(info, dict) or info.get("ok") is not True:
                why = info.get("error") if isinstance(info, dict) else None
                raise RuntimeError(str(why or "a malformed answer"))
            layout = self.layers.layout()
            if (
                info.get("block_size") != self.layers.block_size
                or [[list(s), d] for s, d in layout] != info.get("layout")
                or info.get("num_blocks") != len(dst)
            ):
                raise RuntimeError("the prefill engine's K/V layout differs from this one's")
            try:
                self.layers.write(dst, self._received_layers(info, frames, len(dst)), after)
            finally:
                self._loaded(tid, sock)
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
                entries = list(self._staged.values())
                self._staged.clear()
                self._staged_bytes = 0
            for entry in entries:
                self._discard(entry)
        if self._guard is not None:
            self._guard.close()
        self._ctx.term()


def wait_handshake(sock: zmq.Socket, addr: str, timeout_s: float) -> None:
    """Connect `sock` to `addr` and wait until the CURVE handshake succeeded: a peer that
    is not this deployment's prefill engine (or nothing at all) fails the load in seconds,
    not after LOAD_TIMEOUT_S."""
    events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    events |= zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    monitor = sock.get_monitor_socket(events)
    try:
        sock.connect(addr)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not monitor.poll(int(left * 1000) + 1):
                break
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            raise ConnectionError(
                f"{addr} is not this deployment's prefill engine (handshake failed)"
            )
        raise TimeoutError(f"no authenticated connection to {addr} within {timeout_s:g} s")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


def _text(frame: bytes) -> str:
    try:
        return frame.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("not ASCII text") from None


def _block_number(frame: bytes) -> int:
    if not (frame.isdigit() and len(frame) <= 12) or int(frame) >= MAX_BLOCK_NUMBER:
        raise ValueError(f"not a block number: {frame[:16]!r}")
    return int(frame)
