"""Rank 0's side of the per-step messages to the other ranks (ZMQ, one socket per rank).

Each step the engine core's calls into the executor become ops: ("exec", scheduler
output) when a forward pass starts, ("resolve",) when rank 0 reads a sampling back,
("shutdown",). Ops are queued and sent, in order, with the next "exec": one message per
step, pickled once and the same bytes sent to every rank. "exec" goes out at once (the
ranks must start their forward pass); a "resolve" only changes a rank's host-side token
lists, which nothing reads before its next "exec".

The ranks answer on one control socket: ("ready", rank) once loaded, ("error", rank,
text) before they exit on a failure.
"""

from __future__ import annotations

import pickle
import time

import zmq

SEND_POLL_MS = 100  # a send that waits this long checks whether its rank is still alive


class StepChannel:
    def __init__(self, num_ranks: int, host: str, check_alive) -> None:
        """`check_alive()` raises once a rank has died (a send to it would wait forever)."""
        self.check_alive = check_alive
        self.ctx = zmq.Context()
        self.sockets = []
        self.step_addrs = []
        for _ in range(num_ranks):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only towards a connected rank
            sock.setsockopt(zmq.SNDTIMEO, SEND_POLL_MS)
            port = sock.bind_to_random_port(f"tcp://{host}")
            self.sockets.append(sock)
            self.step_addrs.append(f"tcp://{host}:{port}")
        self.control = self.ctx.socket(zmq.PULL)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control_addr = f"tcp://{host}:{self.control.bind_to_random_port(f'tcp://{host}')}"
        self._queued: list[tuple] = []

    def send(self, op: tuple, now: bool = True, block: bool = True) -> None:
        """Queue `op`; with `now`, send everything queued. Without `block`, a rank that
        never connected (it failed to start) is skipped rather than waited for."""
        self._queued.append(op)
        if not now:
            return
        frame = pickle.dumps(self._queued, protocol=pickle.HIGHEST_PROTOCOL)
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

    def wait_ready(self, timeout_s: float, check_alive) -> None:
        """Until every rank said ready. `check_alive()` raises if one has died."""
        waiting = set(range(1, len(self.sockets) + 1))
        deadline = time.monotonic() + timeout_s
        while waiting:
            check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel ranks {sorted(waiting)} never became ready")
            if self.control.poll(100):
                msg = pickle.loads(self.control.recv())
                if msg[0] == "error":
                    raise RuntimeError(f"tensor-parallel rank {msg[1]} failed: {msg[2]}")
                waiting.discard(msg[1])

    def last_error(self) -> str | None:
        """A rank's ("error", rank, text) if one has arrived (after a rank died)."""
        while self.control.poll(0):
            msg = pickle.loads(self.control.recv())
            if msg[0] == "error":
                return f"rank {msg[1]}: {msg[2]}"
        return None

    def close(self) -> None:
        for sock in [*self.sockets, self.control]:
            sock.close(linger=0)
        self.ctx.term()
