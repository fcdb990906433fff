"""Who may talk on Cadence's internal ZMQ channels: CURVE keys and the check at the door.

Two channels cross process (and host) boundaries with data that steers the engine: the
step messages from the engine to its tensor-parallel ranks, and the K/V a decode engine
fetches from a prefill engine. Both run over ZMQ with CURVE (libzmq's authenticated
encryption):

    server socket   knows its own key pair; lets a peer in only if the peer's public key
                    is one it was given (the ZAP check below), and only after a handshake
                    that proves the peer holds the matching secret key
    client socket   knows its own key pair and the server's public key: it cannot be
                    answered by an impostor (the server proves it holds the secret key)

A peer that fails the handshake or the check never becomes a connection: a PUSH socket
never queues a message towards it, a ROUTER never hands its frames to the application.
Each refusal is logged (rate-limited, so a flood of attempts cannot flood the log).

Keys come from one of two places:
    new_keys()                     a fresh pair per launch (the engine and its ranks: the
                                   ranks receive theirs out of band, on stdin or via Ray)
    keys_from_secret(secret, role) derived from a secret shared by a deployment's engines
                                   (--kv-transfer-secret), one pair per role
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

import zmq
import zmq.auth.thread
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)

ZAP_DOMAIN = "cadence"
LOG_EVERY_S = 10.0  # at most one refusal line per channel in this long (the rest counted)
_REFUSED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol error",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "authentication failed",
}


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair, each key Z85 text (40 characters)."""

    public: str
    secret: str


def new_keys() -> CurveKeys:
    public, secret = zmq.curve_keypair()
    return CurveKeys(public.decode(), secret.decode())


def keys_from_secret(secret: str, role: str) -> CurveKeys:
    """The key pair of `role` ("kv-server", "kv-client") derived from a shared secret:
    every engine given the same secret derives the same pairs."""
    if not secret:
        raise ValueError("a channel secret must not be empty")
    raw = hashlib.sha256(f"cadence-curve\0{role}\0{secret}".encode()).digest()
    secret_z85 = z85.encode(raw)
    return CurveKeys(zmq.curve_public(secret_z85).decode(), secret_z85.decode())


def make_client(sock: zmq.Socket, own: CurveKeys, server_public: str) -> None:
    """Before connect(): talk CURVE, as `own`, to the server that holds `server_public`."""
    sock.curve_secretkey = own.secret.encode()
    sock.curve_publickey = own.public.encode()
    sock.curve_serverkey = server_public.encode()


class ChannelGuard:
    """The server side of one ZMQ context: CURVE server sockets that admit only the
    allowed client keys, and a thread that logs every refused connection.

        guard = ChannelGuard(ctx, server_keys, [client_keys.public], "tensor-parallel steps")
        guard.serve(sock)          before bind(): the socket admits only allowed clients
        guard.close()              before the context terminates
    """

    def __init__(self, ctx: zmq.Context, own: CurveKeys, allowed: list[str], name: str) -> None:
        self.own = own
        self.allowed = frozenset(k.encode() for k in allowed)
        self.name = name
        self.refused = 0  # connections refused since start
        self._last_log = 0.0
        self._unlogged = 0
        self._auth = zmq.auth.thread.ThreadAuthenticator(ctx, log=logger)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)
        self._ctx = ctx
        self._monitors: list[zmq.Socket] = []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ZAP: called on the authenticator's thread for each CURVE handshake that got that far.
    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        self._note_refusal(f"an unknown CURVE key ({key[:8].decode(errors='replace')}...)")
        return False

    def serve(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_secretkey = self.own.secret.encode()
        sock.curve_publickey = self.own.public.encode()
        sock.zap_domain = ZAP_DOMAIN.encode()
        self._monitors.append(
            sock.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            )
        )
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch, name="cadence-channel-guard", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        poller = zmq.Poller()
        watched: set = set()
        while not self._stop.is_set():
            for mon in self._monitors:
                if mon not in watched:
                    poller.register(mon, zmq.POLLIN)
                    watched.add(mon)
            try:
                ready = dict(poller.poll(200))
            except zmq.ZMQError:
                return
            for mon in ready:
                try:
                    event = recv_monitor_message(mon)
                except zmq.ZMQError:
                    continue
                why = _REFUSED.get(event["event"])
                if why is not None and event["event"] != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    # (an auth failure was logged by the ZAP check, with the key)
                    self._note_refusal(f"a peer ({why})")

    def _note_refusal(self, who: str) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f"; {self._unlogged} more since the last report" if self._unlogged else ""
        logger.warning("%s channel: refused %s%s", self.name, who, more)
        self._last_log, self._unlogged = now, 0

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(1)
        for mon in self._monitors:
            mon.close(linger=0)
        self._auth.stop()
