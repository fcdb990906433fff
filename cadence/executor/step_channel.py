"""Rank 0's side of the per-step messages to the other ranks (ZMQ, one socket per rank).

Each step the engine core's calls into the executor become ops (step_messages.py): Exec
when a forward pass starts, Resolve when rank 0 reads a sampling back, Shutdown. Ops are
queued and sent, in order, with the next Exec: one message per step, encoded once (msgspec)
and the same bytes sent to every rank. Exec goes out at once (the ranks must start their
forward pass); a Resolve only changes a rank's host-side token lists, which nothing reads
before its next Exec. The ranks answer on one control socket: Ready once loaded, Failed
before they exit on a failure.

Who can connect: ranks of one host reach rank 0 over ipc:// sockets in the executor's
private directory (mode 0700: no other user can even open them); ranks on other hosts
(Ray) over TCP on the one address they use. Either way every socket is a CURVE server that
admits only the key pair made for this launch and handed to the ranks out of band
(channel_auth.py): a stranger's connection is refused and logged, never sent a step, and
never heard.
"""

from __future__ import annotations

import os
import time

import zmq

from cadence.channel_auth import ChannelGuard, CurveKeys, new_keys
from cadence.executor import step_messages as M

SEND_POLL_MS = 100  # a send that waits this long checks whether its rank is still alive


class StepChannel:
    def __init__(
        self, num_ranks: int, check_alive, ipc_dir: str | None = None, host: str | None = None
    ) -> None:
        """`ipc_dir`: a private directory for ipc:// sockets (ranks on this host); else
        TCP on `host`. `check_alive()` raises once a rank has died (a send to it would
        wait forever)."""
        self.check_alive = check_alive
        self.ctx = zmq.Context()
        # The ranks' credentials: their key pair, and rank 0's public key to check.
        self.rank_keys: CurveKeys = new_keys()
        own = new_keys()
        self.server_public = own.public
        self.guard = ChannelGuard(self.ctx, own, [self.rank_keys.public], "tensor-parallel")
        self.sockets = []
        self.step_addrs = []
        for rank in range(1, num_ranks + 1):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only towards a connected rank
            sock.setsockopt(zmq.SNDTIMEO, SEND_POLL_MS)
            self.step_addrs.append(self._bind(sock, ipc_dir, host, f"step-{rank}"))
            self.sockets.append(sock)
        self.control = self.ctx.socket(zmq.PULL)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control_addr = self._bind(self.control, ipc_dir, host, "control")
        self._queued: list = []

    def _bind(self, sock: zmq.Socket, ipc_dir: str | None, host: str | None, name: str) -> str:
        self.guard.serve(sock)
        if ipc_dir is not None:
            addr = f"ipc://{os.path.join(ipc_dir, name)}"
            sock.bind(addr)
            return addr
        return f"tcp://{host}:{sock.bind_to_random_port(f'tcp://{host}')}"

    def send(self, op, now: bool = True, block: bool = True) -> None:
        """Queue `op`; with `now`, send everything queued. Without `block`, a rank that
        never connected (it failed to start) is skipped rather than waited for."""
        self._queued.append(op)
        if not now:
            return
        frame = M.encode(self._queued)
        self._queued = []
        for sock in self.sockets:
            while True:
                try:
                    sock.send(frame, copy=False)
                    break
                except zmq.Again:
                    if not block:
                        break
                    self.check_alive()

    def _control_messages(self, timeout_ms: int):
        """The ranks' control messages that arrive within `timeout_ms` (one poll)."""
        while self.control.poll(timeout_ms):
            timeout_ms = 0
            yield M.decode_control(self.control.recv())

    def wait_ready(self, timeout_s: float, check_alive) -> None:
        """Until every rank said ready. `check_alive()` raises if one has died."""
        waiting = set(range(1, len(self.sockets) + 1))
        deadline = time.monotonic() + timeout_s
        while waiting:
            check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel ranks {sorted(waiting)} never became ready")
            for msg in self._control_messages(100):
                if isinstance(msg, M.Failed):
                    raise RuntimeError(f"tensor-parallel rank {msg.rank} failed: {msg.text}")
                waiting.discard(msg.rank)

    def last_error(self) -> str | None:
        """A rank's Failed message if one has arrived (after a rank died)."""
        for msg in self._control_messages(0):
            if isinstance(msg, M.Failed):
                return f"rank {msg.rank}: {msg.text}"
        return None

    def close(self) -> None:
        for sock in [*self.sockets, self.control]:
            sock.close(linger=0)
        self.guard.close()
        self.ctx.term()
