"""The engine's outputs, each to the API process that owns the request.

    fanout = OutputFanout(outboxes)          one socket per API process (--api-server-count)
    fanout.own(request_id, client_index)     as a request arrives
    fanout.send(outputs)                     a step's EngineCoreOutputs, split by owner
    fanout.reply(reply)                      an EngineCallReply, to the process that asked
    fanout.broadcast(frame)                  EngineReady, a start-up failure

With one API process everything goes down its socket as it is: one message per step, no
bookkeeping. With several, a step's updates and errors are grouped by owner and each owner
gets one message (one wake-up per step, whatever the number of its requests); every message
carries the stats. A process that owns nothing in the step gets the stats alone, at most
every STATS_EVERY_S (its engine view and gauges stay fresh without a message per step),
except the lead process (index 0, which records the engine's counters for /metrics): it
gets them in any step where a request finished, so a client that has its answer finds the
engine's counters for it in /metrics. Stats alone are sent without waiting: a process that
already left (its drain ended sooner than another's) must not stall the engine, and stats
lost on the way are replaced by the next message.
"""

from __future__ import annotations

import contextlib
import time

import zmq

from cadence.engine import protocol as P

STATS_EVERY_S = 0.05  # the longest a process waits for fresh stats while the engine steps


class SendTimeout(Exception):
    """An API process took nothing for the send timeout: it is gone or wedged."""


def send(outbox: zmq.Socket, frame: bytes) -> None:
    """Send, waiting at most the socket's SNDTIMEO for room; raises SendTimeout."""
    try:
        outbox.send(frame)
    except zmq.Again:
        raise SendTimeout from None


class OutputFanout:
    def __init__(self, outboxes: list[zmq.Socket]) -> None:
        if not outboxes:
            raise ValueError("the engine needs at least one API process to send to")
        self.outboxes = outboxes
        self.owner: dict[str, int] = {}  # request (sample) id -> its API process's index
        self._stats_sent = [0.0] * len(outboxes)  # time.monotonic() of each one's last
        self._held: list[P.EngineCoreOutputs | None] = [None] * len(outboxes)  # not sent yet

    @property
    def single(self) -> bool:
        return len(self.outboxes) == 1

    def own(self, request_id: str, client_index: int) -> None:
        if not self.single:
            if not 0 <= client_index < len(self.outboxes):
                raise ValueError(f"no API process {client_index}")
            self.owner[request_id] = client_index

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self.owner.pop(rid, None)

    def broadcast(self, frame: bytes) -> None:
        for outbox in self.outboxes:
            send(outbox, frame)

    def reply(self, reply: P.EngineCallReply) -> None:
        index = reply.client_index if 0 <= reply.client_index < len(self.outboxes) else 0
        send(self.outboxes[index], P.encoder.encode(reply))

    def send(self, out: P.EngineCoreOutputs) -> None:
        if self.single:
            send(self.outboxes[0], P.encoder.encode(out))
            return
        parts = [
            P.EngineCoreOutputs(stats=out.stats, timestamp=out.timestamp) for _ in self.outboxes
        ]
        owner = self.owner
        finished = False
        for u in out.updates:
            parts[owner.get(u.request_id, 0)].updates.append(u)
            if u.finish_reason is not None:
                owner.pop(u.request_id, None)
                finished = True
        for rid, message in out.errors:
            parts[owner.pop(rid, 0)].errors.append((rid, message))
        for rid, message in out.step_errors:
            parts[owner.pop(rid, 0)].step_errors.append((rid, message))
        now = time.monotonic()
        for i, (outbox, part) in enumerate(zip(self.outboxes, parts)):
            if part.updates or part.errors or part.step_errors:
                send(outbox, P.encoder.encode(part))
            elif now - self._stats_sent[i] >= STATS_EVERY_S or (finished and i == 0):
                with contextlib.suppress(zmq.Again):
                    outbox.send(P.encoder.encode(part), zmq.NOBLOCK)
            else:
                # (the latest, encoded only if flush() has to send it: most are replaced)
                self._held[i] = part
                continue
            self._stats_sent[i] = now
            self._held[i] = None

    def flush(self) -> None:
        """Send the stats held back from a process (the engine is going idle: no later
        message would bring them)."""
        for i, part in enumerate(self._held):
            if part is not None:
                with contextlib.suppress(zmq.Again):
                    self.outboxes[i].send(P.encoder.encode(part), zmq.NOBLOCK)
                self._held[i] = None
                self._stats_sent[i] = time.monotonic()
